"""Clipped policy-gradient surrogate and the per-token weights that turn it into a batch loss.

The batch loss is always ``(per_token_loss * weights).sum()``. Weights are computed once over the whole
optimizer-step batch and sliced row-wise per micro-batch, so gradient accumulation gives the same gradient however
the batch is split.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
# Loss types normalised by the token count of the whole (global) batch, as DAPO.
GLOBAL_TOKEN_MEAN_LOSSES = ("dapo", "cispo", "vespo")


def clipped_surrogate(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    epsilon_low: float,
    epsilon_high: float,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO clipped objective (arXiv:1707.06347) as used by GRPO (arXiv:2402.03300), per token.

    ``logps, old_logps: (B, T)``, ``advantages: (B,)``, ``is_weights: (B, T)`` (detached; e.g. truncated IS weights
    correcting for a stale behaviour policy). Returns ``(per_token_loss, is_low_clipped, is_high_clipped, ratio)``,
    all ``(B, T)``. The clipped flags mark tokens where clipping removed the gradient (TRL's definitions).
    """
    ratio = torch.exp(logps - old_logps.detach())
    adv = advantages.unsqueeze(1)
    clipped_ratio = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(ratio * adv, clipped_ratio * adv)
    if is_weights is not None:
        per_token_loss = per_token_loss * is_weights.detach()
    is_low_clipped = (ratio < 1 - epsilon_low) & (adv < 0)
    is_high_clipped = (ratio > 1 + epsilon_high) & (adv > 0)
    return per_token_loss, is_low_clipped, is_high_clipped, ratio


def truncated_is_weights(proximal_logps: Tensor, behaviour_logps: Tensor, cap: float) -> Tensor:
    """Truncated importance weights ``min(pi_prox / pi_behav, cap)``, detached (IMPALA, arXiv:1802.01561).

    ``proximal_logps, behaviour_logps: (B, T)`` -> ``(B, T)``. Truncation bounds the variance that stale samples
    (e.g. from a replay buffer) would otherwise inject.
    """
    return torch.exp(proximal_logps - behaviour_logps).clamp(max=cap).detach()


def token_weights(
    completion_mask: Tensor, loss_type: LossType, max_completion_length: int, num_tokens: float | None = None
) -> Tensor:
    """Per-token weights ``(N, T)`` so that the loss of an optimizer-step batch is ``(per_token_loss * w).sum()``.

    ``completion_mask: (N, T)`` covers the WHOLE step batch (all micro-batches); slice the result row-wise per
    micro-batch. ``"grpo"``: mean over each sequence's tokens, then over sequences. ``"bnpo"``: mean over all tokens
    of the batch. ``"dr_grpo"``: sum over tokens / (N * max_completion_length) (arXiv:2503.20783). ``"dapo"``: sum over
    tokens / ``num_tokens`` (arXiv:2503.14476), where the caller passes the global token count / number of processes;
    defaults to the local token count; ``"cispo"`` / ``"vespo"`` as dapo, ``"sapo"`` as grpo. ``"luspo"``
    (arXiv:2602.05261): each sequence's loss scaled by its length, i.e. sum over its tokens, mean over sequences.
    """
    mask = completion_mask if completion_mask.is_floating_point() else completion_mask.to(torch.get_default_dtype())
    n = mask.shape[0]
    if loss_type in ("grpo", "sapo"):
        return mask / mask.sum(-1, keepdim=True).clamp(min=1) / n
    if loss_type == "bnpo":
        return mask / mask.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        return mask / (n * max_completion_length)
    if loss_type == "luspo":  # sequence loss times its length = sum over its tokens, then mean over sequences
        return mask / n
    if loss_type in GLOBAL_TOKEN_MEAN_LOSSES:
        total = mask.sum().clamp(min=1) if num_tokens is None else num_tokens
        # A zero global count means every mask is empty, so any positive denominator gives the right (zero) weights.
        return mask / (total if total > 0 else 1.0)
    raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {LossType.__args__}")


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is set; 0 for an empty mask. ``x, mask: (B, T)`` -> scalar."""
    keep = mask.bool()
    # where() rather than x * mask so that NaN/inf at masked-out positions cannot leak in.
    return torch.where(keep, x, 0).sum() / keep.sum().clamp(min=1)
