"""GRPO's side of the generation backends: when to sync the engine's weights, and the correction of the
trainer/engine log-prob mismatch (algos.engine_is_weights) with its metrics. Kept out of trainer.py so the
trainer reads as the algorithm."""

from __future__ import annotations

import time

import torch
from torch import Tensor

from replayrl import algos


def sync_generator(trainer, policy) -> None:
    """Give the backend the policy's weights when they changed since the last sync (an optimizer step ran), and
    only then: at most one sync per optimizer step that precedes a generation."""
    step = trainer.state.global_step
    if trainer._synced_step == step:
        return
    start = time.perf_counter()
    trainer.generator.sync_weights(policy)
    trainer._synced_step = step
    if trainer.args.use_vllm:
        trainer._metrics["train"]["timing/weight_sync"].append(time.perf_counter() - start)


def engine_correction(trainer, mode: str, batch, behaviour: Tensor, is_weights: Tensor | None) -> Tensor | None:
    """Multiply `is_weights` by the truncated importance weights pi_trainer / pi_engine of the engine-sampled
    tokens (TRL's `vllm_importance_sampling_*`), and log the mismatch. `behaviour`: (N, C) the trainer's
    log-probs of the behaviour policy. Rows without engine log-probs (transformers backend) are untouched."""
    args = trainer.args
    if batch.engine_logps is None or not args.use_vllm:
        return is_weights
    mask = batch.completion_mask
    weights = algos.engine_is_weights(
        behaviour,
        batch.engine_logps,
        mask,
        args.vllm_importance_sampling_mode,
        args.vllm_importance_sampling_clip_max,
        args.vllm_importance_sampling_clip_min,
    )
    _log_mismatch(trainer, mode, behaviour, batch.engine_logps, mask, weights)
    if not args.vllm_importance_sampling_correction:
        return is_weights
    return weights if is_weights is None else is_weights * weights


def _log_mismatch(trainer, mode: str, behaviour: Tensor, engine: Tensor, mask: Tensor, weights: Tensor) -> None:
    """sampling/sampling_logp_difference/{mean,max} and sampling/importance_sampling_ratio/{min,mean,max}, over
    every process; a sequence-level ratio counts once per row."""
    diff = algos.logp_difference(behaviour, engine, mask)
    known = mask.bool() & ~engine.isnan()
    ratios = weights[:, 0][known.any(1)] if weights.shape[1] == 1 else weights[known]
    trainer._reduce_means(
        mode,
        {
            "sampling/sampling_logp_difference/mean": (diff.sum(), torch.tensor(diff.numel())),
            "sampling/importance_sampling_ratio/mean": (ratios.sum(), torch.tensor(ratios.numel())),
        },
    )
    empty = float("-inf")  # every process joins the gather, even one with nothing to report
    local = torch.tensor(
        [float(diff.max()), float(-ratios.min()), float(ratios.max())] if diff.numel() else [empty] * 3,
        device=trainer.accelerator.device,
    )
    extremes = trainer.accelerator.gather(local.unsqueeze(0)).amax(0).tolist()
    if extremes[0] == empty:
        return
    metrics = trainer._metrics[mode]
    metrics["sampling/sampling_logp_difference/max"].append(extremes[0])
    metrics["sampling/importance_sampling_ratio/min"].append(-extremes[1])
    metrics["sampling/importance_sampling_ratio/max"].append(extremes[2])
