"""Per-token policy-gradient losses of current TRL's `loss_type`s (the registry that names them: `algos.losses`).

Every loss is a pure function ``fn(logps, old_logps, advantages, mask, level, params) -> PolicyLoss``:

- ``logps (B, T)``: log-probs of the sampled tokens under the policy being trained (with gradient);
- ``old_logps (B, T)``: the behaviour (or proximal) log-probs the ratio is taken against (detached here);
- ``advantages (B,)``; ``mask (B, T)``: tokens that count for a sequence-level ratio (completion minus tool
  results);
- ``level``: ``"token"`` (one ratio per token) or ``"sequence"`` (GSPO, arXiv:2507.18071: one ratio per sequence,
  the exp of the mean token log-ratio, broadcast to every token).

The result's ``per_token_loss`` is ``(B, T)``; aggregation over tokens is done by `losses.token_weights`.
Which loss type uses which function (and which aggregation) is `algos.losses.GRPO_LOSSES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
ImportanceSamplingLevel = Literal[IMPORTANCE_SAMPLING_LEVELS]  # type: ignore[valid-type]


@dataclass(frozen=True)
class PolicyLossParams:
    """Hyper-parameters of the losses (TRL's names). ``delta``: INTELLECT-2's upper clip of the unclipped ratio
    (arXiv:2505.07291); ``sapo_*``: SAPO gate temperatures (arXiv:2511.20347); ``vespo_*``: VESPO gamma weights."""

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    delta: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0


@dataclass
class PolicyLoss:
    """``per_token_loss (B, T)``; ``ratio`` the importance weight (``(B, T)`` or ``(B, 1)``, with gradient);
    ``low_clipped`` / ``high_clipped`` (bool ``(B, T)``): tokens whose gradient the clip removed (TRL's metric
    definitions; all False for losses without a hard clip)."""

    per_token_loss: Tensor
    ratio: Tensor
    low_clipped: Tensor
    high_clipped: Tensor


def importance_log_weights(logps: Tensor, old_logps: Tensor, mask: Tensor, level: str) -> Tensor:
    """Log importance weights. ``"token"``: ``logps - old_logps`` ``(B, T)``. ``"sequence"`` (GSPO): the masked
    mean of the token log-ratios per sequence, ``(B, 1)``; an empty mask gives 0 (ratio 1)."""
    log_ratio = logps - old_logps.detach()
    if level == "token":
        return log_ratio
    if level == "sequence":
        m = mask.to(log_ratio.dtype)
        return ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    raise ValueError(f"importance_sampling_level must be 'token' or 'sequence' (got {level!r}).")


def _flags(ratio: Tensor, adv: Tensor, low: Tensor | None, high: Tensor | None, shape) -> tuple[Tensor, Tensor]:
    none = torch.zeros(shape, dtype=torch.bool, device=ratio.device)
    low_f = none if low is None else (low & (adv < 0)).expand(shape)
    high_f = none if high is None else (high & (adv > 0)).expand(shape)
    return low_f, high_f


def ppo_clip_loss(logps, old_logps, advantages, mask, level, p: PolicyLossParams) -> PolicyLoss:
    """PPO clipped surrogate (arXiv:1707.06347) ``-min(r A, clip(r, 1-eps_low, 1+eps_high) A)``; with ``delta`` the
    unclipped branch uses ``min(r, delta)`` (two-sided clipping, INTELLECT-2). Used by grpo/bnpo/dr_grpo/dapo/luspo,
    which differ only in aggregation (`algos.losses.GRPO_LOSSES`)."""
    ratio = torch.exp(importance_log_weights(logps, old_logps, mask, level))
    adv = advantages.unsqueeze(1)
    clipped = torch.clamp(ratio, 1 - p.epsilon_low, 1 + p.epsilon_high)
    unclipped = ratio if p.delta is None else torch.clamp(ratio, max=p.delta)
    per_token = -torch.min(unclipped * adv, clipped * adv).expand_as(logps)
    low, high = _flags(ratio, adv, ratio < 1 - p.epsilon_low, ratio > 1 + p.epsilon_high, logps.shape)
    return PolicyLoss(per_token, ratio, low, high)


def up_loss(logps, old_logps, advantages, mask, level, p: PolicyLossParams) -> PolicyLoss:
    """UP, Unbounded Positive (arXiv:2607.06987; TRL issue #6407): tokens are routed by the sign of the advantage.
    ``A > 0``: the self-anchored ratio ``r~ = exp(logp - sg(logp))`` (value 1, gradient ``A * grad logp``: REINFORCE,
    no old policy and no upper clip), ``-r~ A``; ``A <= 0``: the PPO clipped surrogate of `ppo_clip_loss`.
    ``ratio`` is the importance ratio against the old policy, as for the other losses."""
    clip = ppo_clip_loss(logps, old_logps, advantages, mask, level, p)
    adv = advantages.unsqueeze(1)
    anchored = torch.exp(logps - logps.detach())
    per_token = torch.where(adv > 0, -anchored * adv, clip.per_token_loss)
    return PolicyLoss(per_token, clip.ratio, clip.low_clipped, torch.zeros_like(clip.high_clipped))


def cispo_loss(logps, old_logps, advantages, mask, level, p: PolicyLossParams) -> PolicyLoss:
    """CISPO (MiniMax-M1, arXiv:2506.13585): REINFORCE with a clipped, detached importance weight,
    ``-sg(min(r, epsilon_high)) * A * logp``. Every token keeps a gradient. (TRL: ``epsilon_high`` is the absolute
    cap, e.g. 5.0 in ScaleRL.)"""
    ratio = torch.exp(importance_log_weights(logps, old_logps, mask, level))
    adv = advantages.unsqueeze(1)
    weight = torch.clamp(ratio, max=p.epsilon_high).detach()
    per_token = -weight * adv * logps
    low, high = _flags(ratio, adv, None, ratio > p.epsilon_high, logps.shape)
    return PolicyLoss(per_token, ratio, low, high)


def sapo_gate(ratio: Tensor, temperature: float | Tensor) -> Tensor:
    """SAPO's soft gate ``sigmoid(tau (r - 1)) * 4 / tau`` (arXiv:2511.20347): value 2/tau and slope 1 at r = 1."""
    return torch.sigmoid(temperature * (ratio - 1)) * 4 / temperature


def sapo_loss(logps, old_logps, advantages, mask, level, p: PolicyLossParams) -> PolicyLoss:
    """SAPO: ``-gate(r; tau) * A`` with ``tau = sapo_temperature_pos`` where A > 0, else ``sapo_temperature_neg``."""
    ratio = torch.exp(importance_log_weights(logps, old_logps, mask, level))
    adv = advantages.unsqueeze(1)
    tau = torch.where(adv > 0, p.sapo_temperature_pos, p.sapo_temperature_neg).to(ratio.dtype)
    per_token = (-sapo_gate(ratio, tau) * adv).expand_as(logps)
    low, high = _flags(ratio, adv, None, None, logps.shape)
    return PolicyLoss(per_token, ratio, low, high)


@torch.no_grad()
def vespo_weights(log_ratio: Tensor, advantages: Tensor, mask: Tensor, p: PolicyLossParams) -> Tensor:
    """VESPO's detached sequence weight ``phi(w) = exp(lambda) w^k exp(-lambda w)`` (phi(1) = 1), with ``w`` the
    product of the token ratios of the sequence, ``(k, lambda)`` picked by the sign of the advantage. ``(B, 1)``."""
    lower = math.log(1e-8)
    seq = (log_ratio.float().clamp(-20.0, 20.0) * mask.float()).sum(-1, keepdim=True)
    log_w = seq.clamp(lower, 20.0)
    nonneg = advantages.unsqueeze(-1) >= 0
    k = torch.where(nonneg, p.vespo_k_pos, p.vespo_k_neg)
    lam = torch.where(nonneg, p.vespo_lambda_pos, p.vespo_lambda_neg).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_loss(logps, old_logps, advantages, mask, level, p: PolicyLossParams) -> PolicyLoss:
    """VESPO: ``-phi(w) * A * logp`` with the detached gamma weight of `vespo_weights` (token level only)."""
    log_ratio = logps - old_logps.detach()
    phi = vespo_weights(log_ratio, advantages, mask, p).to(logps.dtype)
    per_token = -phi * advantages.unsqueeze(1) * logps
    low, high = _flags(phi, advantages.unsqueeze(1), None, None, logps.shape)
    return PolicyLoss(per_token, torch.exp(log_ratio), low, high)


def importance_corrected_kl(per_token_kl: Tensor, logps: Tensor, old_logps: Tensor, mask: Tensor, level: str) -> Tensor:
    """DeepSeek-V3.2 (arXiv:2512.02556) unbiased KL under off-policy samples: ``kl * r`` with the (unclipped)
    importance ratio at the chosen level. ``(B, T)``."""
    return per_token_kl * torch.exp(importance_log_weights(logps, old_logps, mask, level))


def off_policy_sequence_mask(
    advantages: Tensor, logps: Tensor, behaviour_logps: Tensor, mask: Tensor, threshold: float
) -> Tensor:
    """Off-policy sequence masking (DeepSeek-V3.2, Eq. 9): keep a sequence unless its advantage is negative AND
    its mean token KL estimate ``mean(behaviour - logp)`` over its real tokens exceeds ``threshold``.
    ``advantages: (B,)`` or ``(B, 1)``; ``logps, behaviour_logps, mask: (B, T)``. Returns ``(B, 1)`` in the mask's
    float dtype (float32 for a bool mask). A NaN behaviour log-prob (a token the engine could not score) counts as
    zero KL, as in TRL, so one such token cannot drop a sequence."""
    m = mask.to(logps.dtype)
    kl = torch.nan_to_num(behaviour_logps - logps.detach(), nan=0.0)
    seq_kl = (kl * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    keep = (advantages.reshape(-1, 1) >= 0) | (seq_kl <= threshold)
    return keep.to(mask.dtype if mask.is_floating_point() else logps.dtype)
