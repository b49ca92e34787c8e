"""Run by test_checkpoint_safety.py in its own process: GRPO + replay for 6 steps with a checkpoint every 2
steps (save_total_limit=1); with KILL_AT set, the process SIGKILLs itself at that moment of the step-4 save."""

import os
import signal
import sys

import torch

import replayrl.checkpoints as checkpoints
from replayrl.grpo.trainer import GRPOTrainer
from tests.replay.test_checkpoint_safety import run_replay

KILL_AT = os.environ.get("KILL_AT", "")


def die_if(point: str, checkpoint_dir) -> None:
    if KILL_AT == point and str(checkpoint_dir).endswith("checkpoint-4"):
        os.kill(os.getpid(), signal.SIGKILL)


def patch(owner, name: str, point: str, before: bool) -> None:
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        where = args[1] if owner is GRPOTrainer else args[0]
        if before:
            die_if(point, where)
        out = original(*args, **kwargs)
        if not before:
            die_if(point, where)
        return out

    setattr(owner, name, wrapped)


if __name__ == "__main__":
    torch.set_num_threads(1)
    patch(GRPOTrainer, "_save_rng_state", "transformers_files", before=True)  # model + optimizer written
    patch(checkpoints, "save_extra_state", "extra_state", before=False)  # buffer written, no marker yet
    patch(checkpoints, "mark_complete", "marker", before=False)  # complete, old ones not yet rotated
    run_replay(sys.argv[1])
