"""The GRPO-family loss registry: ``loss_type`` -> per-token loss + aggregation over tokens, and the helpers around it.

A loss type is two choices (see `GRPO_LOSSES`):

- the per-token loss ``l_t`` (`algos.policy_losses`: PPO clip, CISPO, SAPO, UP, VESPO), ``(B, T)``;
- the aggregation: per-token weights ``w_t`` such that the loss of an optimizer-step batch is
  ``sum_t w_t * l_t``. Weights are computed once over the whole optimizer-step batch and sliced row-wise per
  micro-batch, so gradient accumulation gives the same gradient however the batch is split.

Everything else derives from the registry: the config's allowed values (`LOSS_TYPES`), the `LossType` literal,
`token_weights`, whether a loss type needs the global token count (its aggregation's `global_token_count`),
which weight sequences by their length (`LENGTH_WEIGHTED_LOSSES`) and which ``importance_sampling_level`` /
``delta`` each accepts (`check_loss_options`). Adding a loss type is one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from replayrl.algos.policy_losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    PolicyLoss,
    PolicyLossParams,
    cispo_loss,
    ppo_clip_loss,
    sapo_loss,
    up_loss,
    vespo_loss,
)

LossFn = Callable[[Tensor, Tensor, Tensor, Tensor, str, PolicyLossParams], PolicyLoss]
# weights(mask (N, T) float, max_completion_length, num_tokens) -> (N, T)
WeightFn = Callable[[Tensor, int, "float | None"], Tensor]


@dataclass(frozen=True)
class Aggregation:
    """How the per-token losses of an optimizer-step batch add up: ``weights(mask, max_len, num_tokens)``.
    ``global_token_count``: the weights need ``num_tokens``, the token count of every process / processes.
    ``length_weighted``: every token weighs the same, so a sequence weighs by its length (not a mean per sequence)."""

    description: str
    weights: WeightFn
    global_token_count: bool = False
    length_weighted: bool = True


def _sequence_mean(mask: Tensor, max_len: int, num_tokens: float | None) -> Tensor:
    return mask / mask.sum(-1, keepdim=True).clamp(min=1) / mask.shape[0]


def _batch_token_mean(mask: Tensor, max_len: int, num_tokens: float | None) -> Tensor:
    return mask / mask.sum().clamp(min=1)


def _max_length_sum(mask: Tensor, max_len: int, num_tokens: float | None) -> Tensor:
    return mask / (mask.shape[0] * max_len)


def _sequence_sum(mask: Tensor, max_len: int, num_tokens: float | None) -> Tensor:
    return mask / mask.shape[0]


def _global_token_mean(mask: Tensor, max_len: int, num_tokens: float | None) -> Tensor:
    total = mask.sum().clamp(min=1) if num_tokens is None else num_tokens
    # A zero global count means every mask is empty, so any positive denominator gives the right (zero) weights.
    return mask / (total if total > 0 else 1.0)


SEQUENCE_MEAN = Aggregation(
    "mean over each sequence's tokens, then over sequences", _sequence_mean, length_weighted=False
)
BATCH_TOKEN_MEAN = Aggregation("token mean over the process's batch", _batch_token_mean)
MAX_LENGTH_SUM = Aggregation("token sum / (sequences * max_completion_length)", _max_length_sum)
SEQUENCE_SUM = Aggregation("sum over each sequence's tokens, mean over sequences", _sequence_sum)
GLOBAL_TOKEN_MEAN = Aggregation(
    "token sum / (global token count / processes)", _global_token_mean, global_token_count=True
)


@dataclass(frozen=True)
class GRPOLoss:
    """One loss type. ``per_token``: ``fn(logps, old_logps, advantages, mask, level, params) -> PolicyLoss``
    (`algos.policy_losses`); ``aggregation``: its token weights; ``levels``: the importance-sampling levels it
    accepts (``level_reason`` says why when that is not both); ``clipped``: it has PPO's hard clip, so ``delta``
    (INTELLECT-2's cap of the unclipped branch) applies; ``source``: where it comes from."""

    per_token: LossFn
    aggregation: Aggregation
    source: str
    levels: tuple[str, ...] = IMPORTANCE_SAMPLING_LEVELS
    level_reason: str = ""
    clipped: bool = True


GRPO_LOSSES: dict[str, GRPOLoss] = {
    "grpo": GRPOLoss(ppo_clip_loss, SEQUENCE_MEAN, "arXiv:2402.03300"),
    "bnpo": GRPOLoss(ppo_clip_loss, BATCH_TOKEN_MEAN, "TRL's batch-normalised GRPO (BNPO)"),
    "dr_grpo": GRPOLoss(ppo_clip_loss, MAX_LENGTH_SUM, "Dr. GRPO, arXiv:2503.20783"),
    "dapo": GRPOLoss(ppo_clip_loss, GLOBAL_TOKEN_MEAN, "DAPO, arXiv:2503.14476"),
    "luspo": GRPOLoss(
        ppo_clip_loss, SEQUENCE_SUM, "LUSPO, arXiv:2602.05261", ("sequence",), "is a sequence-level loss"
    ),
    "cispo": GRPOLoss(cispo_loss, GLOBAL_TOKEN_MEAN, "CISPO (MiniMax-M1), arXiv:2506.13585", clipped=False),
    "sapo": GRPOLoss(sapo_loss, SEQUENCE_MEAN, "SAPO, arXiv:2511.20347", clipped=False),
    "up": GRPOLoss(
        up_loss,
        GLOBAL_TOKEN_MEAN,
        "UP (Unbounded Positive), arXiv:2607.06987",
        ("token",),
        "routes each token by its advantage and self-anchors it",
    ),
    "vespo": GRPOLoss(
        vespo_loss,
        GLOBAL_TOKEN_MEAN,
        "VESPO, arXiv:2602.10693",
        ("token",),
        "already weights whole sequences",
        clipped=False,
    ),
}
"""loss_type -> (per-token loss, aggregation, accepted options): the one place GRPO's loss types are defined."""

LOSS_TYPES = tuple(GRPO_LOSSES)
LossType = Literal[LOSS_TYPES]  # type: ignore[valid-type]  # derived from the registry
# Loss types that sum token terms and accept either importance-sampling level: at the sequence level they weight
# each sequence by its length instead of optimizing the per-sequence objective (TRL's warning; LUSPO is sequence-level
# and length-scaled by design, VESPO token-level only).
LENGTH_WEIGHTED_LOSSES = tuple(
    name
    for name, loss in GRPO_LOSSES.items()
    if loss.aggregation.length_weighted and loss.levels == IMPORTANCE_SAMPLING_LEVELS
)


def grpo_loss(loss_type: str) -> GRPOLoss:
    """The registry entry of ``loss_type``; ValueError naming the valid ones otherwise."""
    if loss_type not in GRPO_LOSSES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES} (got {loss_type!r}).")
    return GRPO_LOSSES[loss_type]


def check_loss_options(loss_type: str, level: str, delta: float | None) -> None:
    """ValueError when ``importance_sampling_level`` or ``delta`` does not fit ``loss_type`` (registry rules)."""
    loss = grpo_loss(loss_type)
    if level in IMPORTANCE_SAMPLING_LEVELS and level not in loss.levels:
        raise ValueError(
            f"loss_type={loss_type!r} {loss.level_reason}: set importance_sampling_level={loss.levels[0]!r}."
        )
    if delta is not None and not loss.clipped:
        raise ValueError(f"delta is a PPO-clip option; loss_type={loss_type!r} has no clipped branch. Unset delta.")


def grpo_policy_loss(
    loss_type: str, logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, level: str, p: PolicyLossParams
) -> PolicyLoss:
    """The per-token loss of ``loss_type`` (shapes: `algos.policy_losses`): ``per_token_loss (B, T)``."""
    return grpo_loss(loss_type).per_token(logps, old_logps, advantages, mask, level, p)


def token_weights(
    completion_mask: Tensor, loss_type: LossType, max_completion_length: int, num_tokens: float | None = None
) -> Tensor:
    """Per-token weights ``(N, T)`` so that the loss of an optimizer-step batch is ``(per_token_loss * w).sum()``.

    ``completion_mask: (N, T)`` covers the WHOLE step batch (all micro-batches); slice the result row-wise per
    micro-batch. The aggregation is the registry's (`GRPO_LOSSES`): ``"grpo"`` / ``"sapo"``: mean over each
    sequence's tokens, then over sequences. ``"bnpo"``: mean over all tokens of the batch. ``"dr_grpo"``: sum over
    tokens / (N * max_completion_length). ``"dapo"`` / ``"cispo"`` / ``"vespo"``: sum over tokens / ``num_tokens``,
    where the caller passes the global token count / number of processes (defaults to the local token count).
    ``"luspo"``: each sequence's loss scaled by its length, i.e. sum over its tokens, mean over sequences.
    """
    mask = completion_mask if completion_mask.is_floating_point() else completion_mask.to(torch.get_default_dtype())
    return grpo_loss(loss_type).aggregation.weights(mask, max_completion_length, num_tokens)


def truncated_is_weights(proximal_logps: Tensor, behaviour_logps: Tensor, cap: float) -> Tensor:
    """Truncated importance weights ``min(pi_prox / pi_behav, cap)``, detached (IMPALA, arXiv:1802.01561).

    ``proximal_logps, behaviour_logps: (B, T)`` -> ``(B, T)``. Truncation bounds the variance that stale samples
    (e.g. from a replay buffer) would otherwise inject.
    """
    return torch.exp(proximal_logps - behaviour_logps).clamp(max=cap).detach()


def second_moment_trust_mask(log_ratio: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """M2PO's token mask (arXiv:2510.01161): the tokens of ``mask`` kept so that the mean of the squared log importance
    ratio over the kept tokens, ``M2 = mean((log pi/mu)^2)``, is at most ``threshold``; the tokens of largest
    ``(log r)^2`` are dropped first, and only as many as needed (none when M2 is already within it).

    ``log_ratio, mask: (B, T)`` -> bool ``(B, T)``, detached. Ties in ``(log r)^2`` are broken by position.
    """
    keep = mask.bool()
    m2 = log_ratio.detach().float().pow(2)
    values = m2[keep]
    if values.numel() == 0 or float(values.mean()) <= threshold:
        return keep.clone()
    ordered, order = values.sort(stable=True)
    # the mean of the k smallest values grows with k: keep the largest k whose mean is within the threshold
    running_mean = ordered.cumsum(0) / torch.arange(1, ordered.numel() + 1, device=ordered.device)
    kept_count = int((running_mean <= threshold).sum())
    flat = torch.zeros_like(values, dtype=torch.bool)
    flat[order[:kept_count]] = True
    out = torch.zeros_like(keep)
    out[keep] = flat
    return out


def masked_mean(x: Tensor, mask: Tensor, axis: int | None = None) -> Tensor:
    """Mean of ``x`` where ``mask`` is set (over everything, or along ``axis``); 0 for an empty mask.
    ``x, mask: (B, T)`` -> scalar, or the shape without ``axis``."""
    keep = mask.bool()
    # where() rather than x * mask so that NaN/inf at masked-out positions cannot leak in.
    kept = torch.where(keep, x, 0)
    if axis is None:
        return kept.sum() / keep.sum().clamp(min=1)
    return kept.sum(axis) / keep.sum(axis).clamp(min=1)
