"""What every script run under `accelerate launch` by the tests does at its end."""

import torch.distributed as dist


def shut_down() -> None:
    """Wait for every process, then destroy the process group while the interpreter is fully alive.

    Left to interpreter teardown, gloo's worker threads and pending work objects (which hold tensors) are destroyed
    in no set order while Python is being finalised, and a process sometimes aborts after its work is done:
    "terminate called without an active exception" (SIGABRT), pytorch/pytorch#190489. The barrier keeps a fast
    process from tearing down its side of a connection another process still reads from.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
