"""Models whose parameters are sharded over processes: DeepSpeed ZeRO-3 and FSDP2 (`docs/distributed.md`).

Under ZeRO-3 every process holds a slice of each parameter (``param.ds_tensor``; ``param`` itself is empty outside
the forward of its module); under FSDP2 a parameter is a ``DTensor``. Three things follow for replayrl:

- **Generation** (`unwrap_for_generation`): TRL's semantics of ``ds3_gather_for_generation``. True: the policy's
  parameters are gathered once per generation batch (``deepspeed.zero.GatheredParameters``, with ZeRO-3's fetch /
  release hooks taken off for the time of it), so `generate` runs on whole weights; False: they stay partitioned
  and each decoding step fetches them layer by layer. Either way, with sharded parameters every process must run
  the same number of forward passes, so `generate` gets ``synced_gpus=True`` (`needs_synced_gpus`; transformers
  turns it on by itself for ZeRO-3 but not for a model sharded by accelerate's FSDP2).
- **Frozen models** (`prepare_frozen_model`, `prepare_reward_models`): a reference, teacher or reward model is an
  inference engine, never trained: under ZeRO-3 a DeepSpeed engine with the training config's stage-3 settings (its
  parameters partitioned like the policy's, TRL's ``prepare_deepspeed``), otherwise accelerate's ``prepare_model``
  in evaluation mode (whole weights; reward models: moved to the device).
- **Reading whole weights** (`gathered_parameters`): weight sync to vLLM, TR-DPO's reference sync and any other code
  that reads ``param.data`` outside a forward.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn


def zero_stage(accelerator) -> int:
    """The DeepSpeed ZeRO stage of the run (0: not DeepSpeed)."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return int(plugin.zero_stage or 0) if plugin is not None else 0


def is_zero3_param(param: torch.Tensor) -> bool:
    return hasattr(param, "ds_id")


def is_dtensor(param: torch.Tensor) -> bool:
    return type(param).__name__ == "DTensor" or type(getattr(param, "data", None)).__name__ == "DTensor"


def needs_synced_gpus(model: nn.Module) -> bool:
    """Whether `generate` must keep the processes in step: parameters sharded (ZeRO-3 or FSDP2) over several
    processes. A process whose rows all ended must still join the others' forward passes, whose layers gather
    weights from every process."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    if torch.distributed.get_world_size() < 2:
        return False
    return is_sharded(model)


def _parameter_offload(engine):
    """ZeRO-3's hook owner of a DeepSpeed engine (None: not a ZeRO-3 engine with an optimizer yet)."""
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is None:
        return None
    return getattr(optimizer, "parameter_offload", None)


@contextmanager
def unwrap_for_generation(model_wrapped, accelerator, gather_zero3: bool = True) -> Iterator[nn.Module]:
    """Yields the policy to generate with. Under ZeRO-3 with ``gather_zero3`` (``ds3_gather_for_generation``) its
    parameters are gathered on every process for the whole block and ZeRO-3's per-module fetch/release hooks are
    taken off (they would release the gathered weights after each layer), then put back. Otherwise the model
    as it is (ZeRO-3 then fetches each layer's weights in every forward)."""
    unwrapped = accelerator.unwrap_model(model_wrapped)
    offload = _parameter_offload(model_wrapped) if zero_stage(accelerator) == 3 else None
    if not gather_zero3 or zero_stage(accelerator) != 3:
        yield unwrapped
        return
    import deepspeed

    params = [p for p in unwrapped.parameters() if is_zero3_param(p)]
    with deepspeed.zero.GatheredParameters(params):
        if offload is not None:
            _remove_zero3_hooks(offload)
        try:
            yield unwrapped
        finally:
            if offload is not None:
                offload._register_deepspeed_module(offload.module)


def _remove_zero3_hooks(offload) -> None:
    """TRL's ``remove_hooks``: drop ZeRO-3's forward/backward hooks of every module, and the sub-module bookkeeping
    that would otherwise release a parameter a hooked forward left active."""
    for param in offload.module.parameters(recurse=True):
        param.ds_active_sub_modules.clear()
    for hook in offload.forward_hooks + offload.backward_hooks:
        hook.remove()
    offload.forward_hooks, offload.backward_hooks = [], []


def generation_context(trainer):
    """`unwrap_for_generation` for a trainer: its wrapped model (the DeepSpeed engine once training started) and
    its config's ``ds3_gather_for_generation`` (True when the config has none)."""
    gather = getattr(trainer.args, "ds3_gather_for_generation", True)
    return unwrap_for_generation(trainer.model_wrapped, trainer.accelerator, gather)


def gathered_parameters(params, modifier_rank: int | None = None):
    """A context in which ZeRO-3 parameters among ``params`` are whole on every process (with ``modifier_rank``,
    what that rank writes into them is partitioned again on exit); other parameters pass through."""
    params = [p for p in params if is_zero3_param(p)]
    if not params:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)


def prepare_frozen_model(model: nn.Module, accelerator) -> nn.Module:
    """A model that is only evaluated (reference, teacher, reward model), placed like the policy: under ZeRO-3 a
    DeepSpeed inference engine that partitions its parameters with the run's stage-3 settings (TRL's
    ``prepare_deepspeed``: no optimizer, never trained); otherwise accelerate's ``prepare_model`` in evaluation
    mode (whole weights on each process, also under ZeRO-1/2 and accelerate 1.15's FSDP2)."""
    if zero_stage(accelerator) != 3:
        return accelerator.prepare_model(model, evaluation_mode=True)
    import deepspeed

    config = _inference_config(accelerator.state.deepspeed_plugin.deepspeed_config, model)
    for param in model.parameters():
        param.requires_grad_(False)
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.eval()
    return engine


def prepare_reward_models(models: list[nn.Module], accelerator) -> list:
    """Reward models (sequence classifiers called by `replayrl.rewards.RewardFunctions`), in evaluation mode on the
    run's device; under ZeRO-3 each is partitioned by a DeepSpeed inference engine as TRL's GRPO does (the module
    keeps ZeRO-3's hooks, so calling it as before gathers each layer's weights in its forward). Returns the engines,
    which the trainer keeps."""
    if zero_stage(accelerator) == 3:
        return [prepare_frozen_model(model, accelerator) for model in models]
    for model in models:
        model.to(accelerator.device).eval()
    return []


def _inference_config(train_config: dict, model: nn.Module) -> dict:
    """The training config as a ZeRO-3 inference engine's: no optimizer, scheduler or batch sizes, the
    model-dependent "auto" bucket sizes filled as transformers fills them for the policy, other "auto" values left
    to DeepSpeed's defaults (transformers resolves them only when training starts)."""
    config = copy.deepcopy(train_config)
    for key in ("optimizer", "scheduler", "train_batch_size", "gradient_accumulation_steps", "gradient_clipping"):
        config.pop(key, None)
    zero = config.setdefault("zero_optimization", {})
    zero["stage"] = 3
    zero.pop("offload_optimizer", None)
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    if hidden:
        sizes = {"reduce_bucket_size": hidden * hidden, "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden)}
        sizes["stage3_param_persistence_threshold"] = 10 * hidden
        zero.update({k: v for k, v in sizes.items() if zero.get(k) == "auto"})
    config = _drop_auto(config)
    config["train_micro_batch_size_per_gpu"] = 1  # required by DeepSpeed, unused without training
    return config


def _drop_auto(config: dict) -> dict:
    return {k: _drop_auto(v) if isinstance(v, dict) else v for k, v in config.items() if v != "auto"}


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with whole tensors (CPU copies) on every process, also under ZeRO-3 and FSDP2 (a
    collective: every process calls it)."""
    with gathered_parameters(model.parameters()):
        return {name: _whole(tensor).detach().cpu().clone() for name, tensor in model.state_dict().items()}


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if is_dtensor(tensor) else tensor


def is_sharded(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is a ZeRO-3 partition or an FSDP2 ``DTensor``."""
    return any(is_zero3_param(p) or is_dtensor(p) for p in model.parameters())


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor], strict: bool = True):
    """Load whole tensors (`full_state_dict`) into ``model``; under ZeRO-3 they are partitioned again on exit, under
    FSDP2 each process keeps its shard of them (`shard_like`). Returns `load_state_dict`'s missing/unexpected keys."""
    with gathered_parameters(model.parameters(), modifier_rank=0):
        return model.load_state_dict(shard_like(state, model), strict=strict)


def shard_like(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Whole tensors as ``model.state_dict()`` holds them: where that is an FSDP2 ``DTensor``, this process's shard
    of the whole tensor as a ``DTensor`` of the same layout (sliced locally: every process has the whole tensor, so
    nothing is sent); other entries unchanged."""
    current = model.state_dict()
    if not any(is_dtensor(t) for t in current.values()):
        return state
    from torch.distributed.tensor import distribute_tensor

    def shard(key: str, value: torch.Tensor) -> torch.Tensor:
        target = current.get(key)
        if target is None or not is_dtensor(target):
            return value
        value = value.to(device=target.device, dtype=target.dtype)
        return distribute_tensor(value, target.device_mesh, target.placements, src_data_rank=None)

    return {key: shard(key, value) for key, value in state.items()}


def local_optimizer_state(optimizer) -> dict:
    """``optimizer.state_dict()`` as a per-process state file can hold it: every FSDP2 ``DTensor`` (moments of a
    sharded parameter) replaced by this process's shard, and the places where that was done listed under
    ``"dtensors"`` (`sharded_optimizer_state` puts the layout back). Without DTensors, the state dict itself."""
    state = optimizer.state_dict()
    places = [[index, key] for index, entry in state["state"].items() for key, v in entry.items() if is_dtensor(v)]
    if not places:
        return state
    entries = {i: {k: v.to_local() if is_dtensor(v) else v for k, v in e.items()} for i, e in state["state"].items()}
    return {**state, "state": entries, "dtensors": places}


def sharded_optimizer_state(optimizer, state: dict) -> dict:
    """`local_optimizer_state`'s output for ``optimizer.load_state_dict``: each listed shard becomes a ``DTensor``
    laid out like its parameter (the same world size and sharding as when it was saved: the checkpoint's settings
    check refuses another world size)."""
    places = state.get("dtensors")
    if not places:
        return state
    from torch.distributed.tensor import DTensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    entries = {i: dict(e) for i, e in state["state"].items()}
    for index, key in places:
        param, local = params[int(index)], entries[index][key]
        entries[index][key] = DTensor.from_local(
            local.to(param.device), param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
        )
    return {k: v for k, v in state.items() if k != "dtensors"} | {"state": entries}
