"""Entropy-based token selection and the entropy bonus (with TRL's adaptive coefficient).

``top_entropy_quantile`` (arXiv:2506.01939, "Beyond the 80/20 rule"): only the highest-entropy ("forking") tokens
carry the policy gradient. The entropy bonus adds ``-coef * H`` to the loss; the adaptive controller moves
``coef`` by a fixed step towards keeping the mean token entropy above a target.
"""

from __future__ import annotations

import torch
from torch import Tensor


def entropy_threshold(entropies: Tensor, quantile: float) -> Tensor:
    """The ``quantile`` (in [0, 1]) of the non-NaN values of ``entropies`` (any shape; NaN = not a token)."""
    flat = entropies.detach().float().reshape(-1)
    if torch.isnan(flat).all():
        return torch.tensor(float("inf"), device=flat.device)
    return torch.nanquantile(flat, quantile)


def entropy_quantile_mask(entropies: Tensor, mask: Tensor, quantile: float, pool: Tensor | None = None) -> Tensor:
    """Keep the real tokens whose entropy is at or above the ``quantile`` (in [0, 1]) of ``pool``: TRL's
    `get_high_entropy_mask` threshold. ``entropies, mask: (B, T)`` -> bool ``(B, T)``. ``pool``: a flat tensor of
    entropies, NaN for padding (e.g. gathered from every process), by default ``entropies[mask]``. ``quantile=0``
    keeps every real token; ``1`` only the highest-entropy one(s); no real token in the pool keeps none."""
    real = mask.bool()
    if pool is None:
        pool = torch.where(real, entropies.detach().float(), torch.nan)
    threshold = entropy_threshold(pool, quantile)
    return (entropies.detach() >= threshold) & real


def high_entropy_mask(entropies: Tensor, mask: Tensor, top_quantile: float, pool: Tensor | None = None) -> Tensor:
    """Keep tokens whose entropy is in the top ``top_quantile`` fraction (the config's ``top_entropy_quantile``):
    `entropy_quantile_mask` at the ``1 - top_quantile`` quantile. ``top_quantile=1`` keeps every masked token;
    ``0`` keeps only the highest-entropy token(s)."""
    return entropy_quantile_mask(entropies, mask, 1.0 - top_quantile, pool)


def adaptive_entropy_coef(
    coef: float, entropy: float, target: float, delta: float, coef_min: float, coef_max: float
) -> float:
    """One step of the adaptive controller: raise ``coef`` by ``delta`` (up to ``coef_max``) when the measured mean
    token ``entropy`` is at or below ``target``, else lower it (down to ``coef_min``)."""
    if entropy <= target:
        return min(coef + delta, coef_max)
    return max(coef - delta, coef_min)


def applied_entropy_coef(coef: float, last_entropy: float | None, target: float, adaptive: bool) -> float:
    """The coefficient applied to this step's bonus: the static ``coef``; in adaptive mode 0 until the first
    measurement (``last_entropy`` None, TRL's initial ``inf``) and while the last measured entropy is above
    ``target`` (the bonus only acts against collapse)."""
    if not adaptive:
        return coef
    if last_entropy is None or last_entropy > target:
        return 0.0
    return coef
