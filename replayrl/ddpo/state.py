"""DDPO's run files: metrics.jsonl, and the checkpoint glue around `replayrl.checkpoints` (RNG states, settings)."""

from __future__ import annotations

import json
import random
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
)
from replayrl.metrics import METRICS_FILE, json_value, read_metrics

# Settings that change what a checkpoint's state means (a resumed run must use the same).
CHECKED_SETTINGS = ("per_prompt_stat_tracking", "train_batch_size", "sample_batch_size", "sample_num_steps")


class MetricsWriter:
    """Appends ``{"step": ..., **metrics}`` lines to ``run_dir/metrics.jsonl`` (main process only). `start` keeps
    the lines up to a resumed run's step, so the file reads as one run."""

    def __init__(self, run_dir: str | Path, enabled: bool = True):
        self.path = Path(run_dir) / METRICS_FILE
        self.enabled = enabled

    def start(self, global_step: int) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= global_step] if global_step else []
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **{k: json_value(v) for k, v in metrics.items()}}) + "\n")


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """Every random state a DDPO epoch draws from: python's (prompt functions), numpy's, torch's and the trainer's
    sampling generator (noise and shuffles)."""
    import numpy as np

    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype("int64")), *map(json_value, np_state[2:])],
        "torch": torch.get_rng_state(),
        "generator": generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    import numpy as np

    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    generator.set_state(state["generator"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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


def refuse_stale_checkpoints(run_dir: Path) -> None:
    """A fresh run must not mix with an earlier run's checkpoints in the same folder."""
    old = checkpoints_in(run_dir)
    if old:
        raise ValueError(
            f"{run_dir} already holds checkpoints ({old[-1].name}, ...) from an earlier run: resume it with "
            f"resume_from={str(run_dir)!r}, or choose another logdir (or project_kwargs['project_dir'])"
        )
