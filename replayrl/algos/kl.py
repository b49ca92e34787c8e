"""Per-token estimators of KL(pi || pi_ref) from samples of pi.

From J. Schulman, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html). With ``r = ref - logp``
(log of pi_ref / pi at a token sampled from pi): k1 = -r is unbiased but high-variance and can be negative; k2 = r^2/2
is biased but low-variance; k3 = (e^r - 1) - r is unbiased, low-variance and always >= 0 (used by GRPO,
arXiv:2402.03300).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def kl_k1(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """k1 = logp - ref. ``logps, ref_logps: (B, T)`` -> ``(B, T)``."""
    return logps - ref_logps


def kl_k2(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """k2 = (logp - ref)^2 / 2. ``logps, ref_logps: (B, T)`` -> ``(B, T)``."""
    return 0.5 * (logps - ref_logps) ** 2


def kl_k3(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1 >= 0. ``logps, ref_logps: (B, T)`` -> ``(B, T)``."""
    log_ratio = ref_logps - logps
    # expm1 keeps precision when the policies are close, which is the common case.
    return torch.expm1(log_ratio) - log_ratio


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
