"""Group-relative advantages for GRPO (arXiv:2402.03300).

Rewards arrive flat, ``(N,)`` with ``N = num_prompts * G``: the ``G`` completions of one prompt are contiguous.
A NaN reward means "no reward function scored this sample"; such samples are left out of every statistic and get
advantage exactly 0, so they contribute no gradient.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

ScaleRewards = Literal["group", "batch", "none"]


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
    argues the std division biases towards too-easy / too-hard prompts). Statistics use scored (non-NaN) rewards only;
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
    elif scale_rewards != "none":
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}; expected 'group', 'batch' or 'none'")
    return centred.reshape(-1)
