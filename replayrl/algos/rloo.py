"""REINFORCE Leave-One-Out (RLOO, arXiv:2402.14740; Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline
for free"): the baseline of each completion is the mean reward of the OTHER completions of its prompt.

Rewards arrive flat, ``(N,)`` with ``N = num_prompts * G``, the ``G`` completions of one prompt contiguous (as in
`replayrl.algos.advantages`). A NaN reward means "no reward function scored this sample": it is left out of its
siblings' baselines, and gets advantage 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from replayrl.algos.advantages import _nan_mean_std, group_rewards_view


def leave_one_out_advantages(rewards: Tensor, num_generations: int) -> Tensor:
    """``A_i = r_i - mean_{j != i, r_j scored} r_j``. ``rewards: (N,)`` -> ``(N,)``.

    Equivalent to ``G / (G - 1) * (r_i - mean(group))`` when every reward is scored. An unscored completion, or one
    whose group has no other scored member (no baseline), gets NaN, as in TRL's RLOOTrainer: `rloo_advantages`
    leaves those out of the normalisation and then sets them to 0.
    """
    grouped = group_rewards_view(rewards, num_generations)
    scored = ~torch.isnan(grouped)
    values = torch.where(scored, grouped, 0)
    others = scored.sum(-1, keepdim=True) - scored.long()  # scored siblings of each completion
    baseline = (values.sum(-1, keepdim=True) - values) / others.clamp(min=1)
    advantages = torch.where(scored & (others > 0), grouped - baseline, torch.nan)
    return advantages.reshape(-1)


def normalize_advantages(advantages: Tensor, eps: float = 1e-4) -> Tensor:
    """TRL's `normalize_advantages`: ``(A - mean(A)) / (std(A) + eps)`` over the whole batch (unbiased std, NaN
    entries ignored and returned as 0). ``advantages: (N,)`` -> ``(N,)``."""
    _, mean, std = _nan_mean_std(advantages.reshape(1, -1))
    return torch.nan_to_num((advantages - mean) / (std + eps), nan=0.0)


def rloo_advantages(rewards: Tensor, num_generations: int, normalize: bool = False) -> Tensor:
    """TRL's RLOO advantages: leave-one-out, optionally normalised over the batch, NaN (no baseline) -> 0.
    ``rewards: (N,)`` -> ``(N,)``."""
    advantages = leave_one_out_advantages(rewards, num_generations)
    if normalize:
        advantages = normalize_advantages(advantages)
    return torch.nan_to_num(advantages, nan=0.0)


def sequence_clipped_surrogate(
    log_ratio: Tensor, advantages: Tensor, epsilon_low: float, epsilon_high: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """RLOO's per-sequence PPO-clipped objective (TRL's RLOOTrainer): one ratio per completion, the exp of the SUM of
    its token log-ratios, ``loss_i = -min(rho_i A_i, clip(rho_i, 1 - eps_low, 1 + eps_high) A_i)``.

    ``log_ratio: (B,)`` (with gradient; summed over the completion's tokens), ``advantages: (B,)``. Returns
    ``(loss (B,), ratio (B,), low_clipped (B,), high_clipped (B,))``; the flags mark sequences whose gradient the
    clip removed (TRL's definitions).
    """
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    loss = -torch.min(ratio * advantages, clipped * advantages)
    low = (ratio < 1 - epsilon_low) & (advantages < 0)
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    return loss, ratio, low, high
