"""Group-relative advantages for GRPO (arXiv:2402.03300).

Rewards arrive flat, ``(N,)`` with ``N = num_prompts * G``: the ``G`` completions of one prompt are contiguous.
A NaN reward means "no reward function scored this sample"; such samples are left out of every statistic and get
advantage exactly 0, so they contribute no gradient.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

ScaleRewards = Literal["group", "batch", "none", "mean"]


def group_rewards_view(rewards: Tensor, num_generations: int) -> Tensor:
    """Reshape flat rewards ``(N,)`` into groups ``(N // G, G)``.

    ``N % G != 0`` is a bug in the caller's batching, hence an AssertionError (raised explicitly so ``python -O``
    does not strip it).
    """
    if rewards.numel() % num_generations != 0:
        raise AssertionError(f"{rewards.numel()} rewards do not split into groups of {num_generations}")
    return rewards.reshape(-1, num_generations)


def _nan_mean_std(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Row-wise mean and unbiased std over the non-NaN entries of ``x: (M, K)``.

    Returns ``(count (M,), mean (M,), std (M,))``; a row with no scored entry has mean 0 and one with fewer than two
    has std 0, so neither can leak NaN downstream.
    """
    scored = ~torch.isnan(x)
    count = scored.sum(-1)
    mean = torch.where(scored, x, 0).sum(-1) / count.clamp(min=1)
    sq_dev = torch.where(scored, (x - mean.unsqueeze(-1)) ** 2, 0).sum(-1)
    std = torch.where(count >= 2, (sq_dev / (count - 1).clamp(min=1)).sqrt(), 0)
    return count, mean, std


def group_std(rewards: Tensor, num_generations: int) -> Tensor:
    """Unbiased (n-1) std of each group's scored rewards. ``rewards: (N,)`` -> ``(N // G,)``."""
    return _nan_mean_std(group_rewards_view(rewards, num_generations))[2]


def zero_std_groups(rewards: Tensor, num_generations: int, atol: float = 1e-6) -> Tensor:
    """Flag groups whose scored rewards are all equal within ``atol``. ``rewards: (N,)`` -> bool ``(N // G,)``.

    Such groups carry no learning signal (every advantage is 0). A group with no scored member counts as zero-std.
    """
    grouped = group_rewards_view(rewards, num_generations)
    scored = ~torch.isnan(grouped)
    hi = torch.where(scored, grouped, -torch.inf).amax(-1)
    lo = torch.where(scored, grouped, torch.inf).amin(-1)
    return (hi - lo <= atol) | ~scored.any(-1)


def group_advantages(rewards: Tensor, num_generations: int, scale_rewards: ScaleRewards, eps: float = 1e-4) -> Tensor:
    """GRPO advantages ``A_i = (r_i - mean(group)) / (std + eps)``. ``rewards: (N,)`` -> ``(N,)``.

    ``scale_rewards`` picks the std: ``"group"`` per-group std; ``"batch"`` std of all N raw rewards (TRL's
    ``scale_rewards="batch"``, centring is still per group); ``"none"`` no division (Dr. GRPO, arXiv:2503.20783, which
    argues the std division biases towards too-easy / too-hard prompts); ``"mean"`` divides by the group mean
    (MaxRL, arXiv:2602.02710). Statistics use scored (non-NaN) rewards only;
    unscored samples get advantage 0.
    """
    grouped = group_rewards_view(rewards, num_generations)
    scored = ~torch.isnan(grouped)
    _, mean, std = _nan_mean_std(grouped)
    centred = torch.where(scored, grouped - mean.unsqueeze(-1), 0)
    if scale_rewards == "group":
        centred = centred / (std.unsqueeze(-1) + eps)
    elif scale_rewards == "batch":
        centred = centred / (_nan_mean_std(rewards.reshape(1, -1))[2] + eps)
    elif scale_rewards == "mean":  # MaxRL: (r - mean) / (mean + eps); for 0/1 rewards, divide by the success rate
        centred = centred / (mean.unsqueeze(-1) + eps)
    elif scale_rewards != "none":
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}; expected 'group', 'batch', 'none' or 'mean'")
    return centred.reshape(-1)


def normalize_then_sum_advantages(
    per_func: Tensor, weights: Tensor, num_generations: int, eps: float = 1e-4
) -> tuple[Tensor, Tensor]:
    """GDPO (arXiv:2601.05242) multi-reward advantages: normalise each reward function within its group first,
    ``z_k = (r_k - mean_g(r_k)) / (std_g(r_k) + eps)``, take the weighted sum ``s = sum_k w_k z_k`` (NaN = not
    scored, skipped), then normalise ``s`` over the whole batch. ``per_func: (N, F)``, ``weights: (F,)`` ->
    ``(s (N,), advantages (N,))``. Unlike summing first, a reward with a large scale cannot drown the others."""
    n, f = per_func.shape
    grouped = per_func.reshape(-1, num_generations, f).transpose(1, 2)  # (groups, F, G)
    flat = grouped.reshape(-1, num_generations)
    _, mean, std = _nan_mean_std(flat)
    z = (flat - mean.unsqueeze(-1)) / (std.unsqueeze(-1) + eps)
    z = z.reshape(-1, f, num_generations).transpose(1, 2).reshape(n, f)
    summed = (z * weights.to(z.device).unsqueeze(0)).nansum(dim=1)
    _, batch_mean, batch_std = _nan_mean_std(summed.reshape(1, -1))
    return summed, (summed - batch_mean) / (batch_std + eps)
