"""DDPO's checkpoint glue around `replayrl.checkpoints`: the settings a checkpoint depends on, finding and loading
one (with its RNG states)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from replayrl.checkpoints import (
    check_settings,
    checkpoints_in,
    last_complete_checkpoint,
    load_extra_state,
    mark_complete,
    resolve_resume,
    set_rng_state,
)

# Settings that change what a checkpoint's state means (a resumed run must use the same).
CHECKED_SETTINGS = ("per_prompt_stat_tracking", "train_batch_size", "sample_batch_size", "sample_num_steps")


def _settings(config, num_processes: int) -> dict[str, Any]:
    return {"trainer": "DDPOTrainer", **{k: getattr(config, k) for k in CHECKED_SETTINGS}, "world_size": num_processes}


def mark_checkpoint(path: Path, config, num_processes: int) -> None:
    mark_complete(path, _settings(config, num_processes))


def latest_checkpoint(resume_from: str | Path) -> Path:
    """A complete checkpoint folder, or the last complete one inside a run folder."""
    path = Path(resume_from)
    if path.is_dir() and checkpoints_in(path) and last_complete_checkpoint(path) is not None:
        return last_complete_checkpoint(path)
    if path.is_dir() and checkpoints_in(path):
        return resolve_resume(True, str(path))  # raises: only incomplete ones
    return resolve_resume(str(path), str(path.parent))


def load_checkpoint_state(
    path: Path, name: str, rank: int, num_processes: int, config, generator: torch.Generator
) -> dict[str, Any]:
    """Check the checkpoint's settings, load this process's state and restore the RNG states from it."""
    check_settings(path, _settings(config, num_processes), adaptable=set())
    state = load_extra_state(path, f"{name}_rank{rank}")
    set_rng_state(state["rng"], generator)
    return state
