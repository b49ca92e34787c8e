"""Correction of the trainer/engine mismatch: the generation engine (vLLM) and the trainer compute slightly
different probabilities for the same policy (kernels, precision, batching), so samples drawn by the engine are
mildly off-policy for the trainer. Truncated importance sampling (TIS) reweights each token, or each sequence,
by ``pi_trainer / pi_engine``, truncated or masked above a cap (Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training"; IMPALA's truncation, arXiv:1802.01561). Same modes and metrics as
TRL's `vllm_importance_sampling_mode`.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

ISMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def engine_is_weights(
    trainer_logps: Tensor,
    engine_logps: Tensor,
    mask: Tensor,
    mode: ISMode,
    cap: float | None,
    clip_min: float | None = None,
) -> Tensor:
    """Importance weights ``pi_trainer / pi_engine`` for tokens sampled by an engine, detached.

    ``trainer_logps, engine_logps, mask: (B, T)``. Token modes: one ratio per token, ``(B, T)``. Sequence modes:
    the product of a row's token ratios over its real tokens (``exp`` of the summed log-ratio), ``(B, 1)``.
    Bounds ``[clip_min, cap]`` (TRL's ``C_min``, ``C_max``; None: unbounded on that side): ``*_truncate`` clamps
    the ratio into them; ``*_mask`` sets ratios outside them to 0 (the token or sequence drops out of the loss).
    Positions outside ``mask`` (and NaN engine log-probs, i.e. rows the engine did not sample) contribute a
    log-ratio of 0.
    """
    if mode not in IS_MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {IS_MODES} (got {mode!r}).")
    known = mask.bool() & ~engine_logps.isnan()
    log_ratio = torch.where(known, trainer_logps.detach() - engine_logps, torch.zeros_like(trainer_logps))
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True)
    ratio = torch.exp(log_ratio)
    if mode.endswith("truncate"):
        return ratio.clamp(min=clip_min, max=cap)
    outside = torch.zeros_like(ratio, dtype=torch.bool)
    if cap is not None:
        outside |= ratio > cap
    if clip_min is not None:
        outside |= ratio < clip_min
    return ratio.masked_fill(outside, 0.0)


def logp_difference(trainer_logps: Tensor, engine_logps: Tensor, mask: Tensor) -> Tensor:
    """``|log pi_trainer - log pi_engine|`` on the real, engine-sampled tokens, flattened to ``(K,)``."""
    known = mask.bool() & ~engine_logps.isnan()
    return (trainer_logps.detach() - engine_logps)[known].abs()
