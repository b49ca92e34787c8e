"""The end of a multi-process run: every process waits, then tears its process group down while Python is alive.

Left to interpreter teardown, gloo's worker threads and the pending work objects they hold (tensors with Python
references) are destroyed in no set order while the interpreter is being finalised, and a process sometimes aborts
after its work is done: "terminate called without an active exception" (SIGABRT; pytorch/pytorch#190489).
`destroy_process_group` alone is not enough: it only drops the registry's reference, and a model wrapped in
`DistributedDataParallel` (its reducer) keeps the group alive until that model is freed, which for a trainer
caught in reference cycles is at interpreter teardown. So the cycles are collected first.

Looks only at a torch that the process already imported, so that `import replayrl` stays light.
"""

from __future__ import annotations

import gc
import sys


def end_distributed() -> None:
    """Collect unreachable trainers/models (their DDP reducers hold the process group), wait for every process (a
    fast process must not tear down a connection that another still reads from), destroy the process group, and
    collect again so that its last references go now. A no-op without an initialised process group."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()


def check_launch_settings(args) -> None:
    """Before any expensive work: refuse training arguments with which accelerate would silently not run the
    DeepSpeed that `accelerate launch` asked for (it sets ACCELERATE_USE_DEEPSPEED). Its CPU path ignores DeepSpeed
    (`use_cpu=True` trains with DDP), and without a GPU and without `ddp_backend` no process group is formed (every
    process trains alone, each believing it is the only one)."""
    import os

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true" or args is None:
        return
    if getattr(args, "use_cpu", False) or os.environ.get("ACCELERATE_USE_CPU", "false").lower() == "true":
        raise ValueError(
            "use_cpu=True (or ACCELERATE_USE_CPU) under DeepSpeed (accelerate launch with a deepspeed config): "
            "accelerate would train without DeepSpeed. On CPU pass use_cpu=False and ddp_backend='gloo' "
            "(--use_cpu false --ddp_backend gloo) and set DS_ACCELERATOR=cpu; see docs/distributed.md."
        )
    torch = sys.modules.get("torch")
    has_gpu = torch is not None and torch.cuda.is_available()
    if not has_gpu and getattr(args, "ddp_backend", None) is None:
        raise ValueError(
            "DeepSpeed on a machine without a GPU needs ddp_backend='gloo' (--ddp_backend gloo) and "
            "DS_ACCELERATOR=cpu: without it accelerate forms no process group; see docs/distributed.md."
        )
