"""KTO: Kahneman-Tversky Optimisation from unpaired desirable / undesirable completions (arXiv:2402.01306), and the
unpaired APO-zero variant (arXiv:2408.06266), as TRL 1.16's KTOTrainer computes them.

With the policy/reference log-ratio of each completion ``r = log pi(y|x) - log pi_ref(y|x)`` (summed over its
tokens) and the reference point ``z0``, an estimate of KL(pi || pi_ref) from MISMATCHED pairs (x_i, y_j), detached
and clamped at 0:
  kto:               desirable   ``w_d * (1 - sigmoid(beta * (r - z0)))``
                     undesirable ``w_u * (1 - sigmoid(beta * (z0 - r)))``
  apo_zero_unpaired: desirable   ``w_d * (1 - sigmoid(beta * r))``,  undesirable ``w_u * sigmoid(beta * r)``
The batch loss is the mean of the per-example values.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KTOLossType = Literal["kto", "apo_zero_unpaired"]
KTO_LOSS_TYPES = ("kto", "apo_zero_unpaired")


def kto_reference_point(kl_sum: Tensor, kl_count: Tensor) -> Tensor:
    """``z0 = max(0, kl_sum / kl_count)``, detached: the mean over mismatched pairs of
    ``log pi(y_j|x_i) - log pi_ref(y_j|x_i)``, given as its sum and count (summed over processes by the caller)."""
    return (kl_sum.detach() / kl_count.clamp(min=1)).clamp(min=0)


def kto_losses(
    logratios: Tensor,
    desirable: Tensor,
    reference_point: Tensor | float,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    loss_type: KTOLossType = "kto",
) -> Tensor:
    """Per-example KTO losses, weighted. ``logratios: (B,)`` (with gradient), ``desirable: (B,)`` bool,
    ``reference_point``: z0 (scalar, detached; unused by apo_zero_unpaired) -> ``(B,)``."""
    z0 = torch.as_tensor(reference_point, dtype=logratios.dtype, device=logratios.device).detach()
    if loss_type == "kto":
        good = 1 - torch.sigmoid(beta * (logratios - z0))
        bad = 1 - torch.sigmoid(beta * (z0 - logratios))
    elif loss_type == "apo_zero_unpaired":
        good = 1 - torch.sigmoid(beta * logratios)
        bad = torch.sigmoid(beta * logratios)
    else:
        raise ValueError(f"unknown KTO loss_type {loss_type!r}; expected one of {KTO_LOSS_TYPES}")
    return torch.where(desirable, desirable_weight * good, undesirable_weight * bad)


def mismatched_partners(n: int) -> Tensor:
    """For rows 0..n-1, the row whose completion each row's prompt is paired with to estimate z0: neighbours swap in
    blocks of two, (0,1)(2,3)...; with n odd the last block of three rotates. Every completion is used once and no row
    keeps its own (n >= 2); the blocks do not depend on how the rows are split into even-sized micro-batches or
    processes. ``-> (n,)`` long."""
    if n < 2:
        raise ValueError(f"the KL estimate needs at least 2 rows to mismatch (got {n}); use a larger batch.")
    partners = torch.arange(n) ^ 1  # 0<->1, 2<->3, ...
    if n % 2 == 1:
        partners[n - 3 :] = torch.tensor([n - 1, n - 3, n - 2])
    return partners
