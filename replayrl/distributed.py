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
