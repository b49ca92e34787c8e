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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor


def _kto(logratios: Tensor, z0: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    return 1 - torch.sigmoid(beta * (logratios - z0)), 1 - torch.sigmoid(beta * (z0 - logratios))


def _apo_zero_unpaired(logratios: Tensor, z0: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    return 1 - torch.sigmoid(beta * logratios), torch.sigmoid(beta * logratios)


@dataclass(frozen=True)
class KTOLoss:
    """One KTO loss type. ``fn(logratios (B,), z0, beta) -> (desirable loss (B,), undesirable loss (B,))``, before
    the weights; ``reference_point``: it uses z0, so the trainer estimates it from mismatched pairs."""

    fn: Callable[[Tensor, Tensor, float], tuple[Tensor, Tensor]]
    reference_point: bool
    source: str


KTO_LOSSES: dict[str, KTOLoss] = {
    "kto": KTOLoss(_kto, True, "arXiv:2402.01306"),
    "apo_zero_unpaired": KTOLoss(_apo_zero_unpaired, False, "arXiv:2408.06266"),
}
"""loss_type -> KTOLoss: the one place KTO's loss types are defined (the config's allowed values derive from it)."""
KTO_LOSS_TYPES = tuple(KTO_LOSSES)
KTOLossType = Literal[KTO_LOSS_TYPES]  # type: ignore[valid-type]  # derived from the registry


def kto_loss_entry(loss_type: str) -> KTOLoss:
    """The registry entry of ``loss_type``; ValueError naming the valid ones otherwise."""
    if loss_type not in KTO_LOSSES:
        raise ValueError(f"loss_type must be one of {KTO_LOSS_TYPES} (got {loss_type!r}).")
    return KTO_LOSSES[loss_type]


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
    good, bad = kto_loss_entry(loss_type).fn(logratios, z0, beta)
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
