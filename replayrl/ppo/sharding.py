"""`PPOTrainer` under DeepSpeed ZeRO-2 / ZeRO-3 and FSDP2 (`docs/distributed.md`).

PPO runs its own loop on its own `Accelerator`, so what transformers' Trainer does for its users is done here:

- **The DeepSpeed config's "auto" values** are filled from `PPOConfig` before the engine is built:
  ``gradient_clipping`` from ``max_grad_norm`` (0: none; accelerate would otherwise fill in 1.0, which made the
  ZeRO-2 update differ from one process's), ``train_micro_batch_size_per_gpu`` from ``mini_batch_size`` (PPO prepares
  no DataLoader with the model, so accelerate could not infer it). A number in the config that contradicts
  `PPOConfig` is refused, as transformers' Trainer refuses a mismatch with its arguments.
- **Backward and step** go to the engine itself (`engine_backward`): DeepSpeed owns the gradient partitions, the
  clipping and the optimizer step, and an accumulation boundary is PPO's (every ``gradient_accumulation_steps``
  mini-batches), not accelerate's ``sync_gradients`` (always True outside `Accelerator.accumulate`).
- **Under ZeRO-3** the reference is a partitioned inference engine (`replayrl.models.sharding.prepare_frozen_model`),
  and layers shared with the policy (``num_shared_layers``) are refused: they would be partitioned by both engines.
- **Generation** (`generation_context`): under ZeRO-3 the policy's weights are gathered once per call
  (``ds3_gather_for_generation``); under FSDP2 the value-head wrapper's own group (what no decoder-layer unit holds:
  embeddings, final norm, head) is unsharded for the call, because `generate` runs the language model inside the
  wrapper, never the wrapper's forward, whose hook would gather it (and would make the wrapper FSDP2's root: done
  here before the first call).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn

from replayrl.models.sharding import unwrap_for_generation, zero_stage


def is_deepspeed(accelerator) -> bool:
    return getattr(accelerator.state, "deepspeed_plugin", None) is not None


def configure_deepspeed(accelerator, config, num_shared_layers: int | None) -> None:
    """Fill the DeepSpeed config's "auto" values from ``config`` (a `PPOConfig`); refuse contradictions."""
    if not is_deepspeed(accelerator):
        return
    plugin = accelerator.state.deepspeed_plugin
    ds = plugin.deepspeed_config
    if num_shared_layers is not None and zero_stage(accelerator) == 3:
        raise ValueError(
            f"num_shared_layers={num_shared_layers} under DeepSpeed ZeRO-3: the shared layers would be partitioned by "
            "both the policy's and the reference's engine. Leave num_shared_layers=None (ZeRO-3 partitions the "
            "reference's parameters over the processes anyway) or use ZeRO-2."
        )
    wanted = {
        "gradient_clipping": float(config.max_grad_norm or 0.0),  # DeepSpeed: 0 = no clipping
        "train_micro_batch_size_per_gpu": config.mini_batch_size,
    }
    for key, value in wanted.items():
        current = ds.get(key, "auto")
        if current == "auto":
            ds[key] = value
        elif float(current) != float(value):
            source = "max_grad_norm" if key == "gradient_clipping" else "mini_batch_size"
            raise ValueError(
                f"the DeepSpeed config sets {key}={current} but PPOConfig.{source} gives {value}; set it to "
                f'"auto" in the DeepSpeed config (PPOTrainer fills it in) or make the two agree.'
            )


def engine_backward(engine, loss: Tensor, gradient_accumulation_steps: int, sync: bool) -> None:
    """``loss / gradient_accumulation_steps`` into the engine's gradient partitions; at ``sync`` (PPO's accumulation
    boundary) the engine reduces, clips (``gradient_clipping``) and steps, then zeroes the gradients."""
    engine.set_gradient_accumulation_boundary(sync)
    engine.backward(loss / gradient_accumulation_steps, scale_wrt_gas=False)
    if sync:
        engine.step()


@contextmanager
def generation_context(model_wrapped, accelerator, gather_zero3: bool) -> Iterator[nn.Module]:
    """The policy to call `generate` on (see the module docstring)."""
    with unwrap_for_generation(model_wrapped, accelerator, gather_zero3) as model:
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(model, FSDPModule):
            yield model
            return
        # FSDP2 picks its root at the first forward: `generate` before any forward of the wrapper (the first thing
        # `train()` does) would make the first decoder layer a root of its own, and the wrapper's forward then
        # fails ("already lazily initialized"). So the wrapper is made the root first, as its forward would.
        model._get_fsdp_state()._lazy_init()
        model.unshard()
        try:
            yield model
        finally:
            model.reshard()
