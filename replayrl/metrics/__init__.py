"""The record of every run, whatever the trainer: `metrics.jsonl` in `output_dir` (one JSON object per log, with
its `step`), written by `MetricsFile` (through `MetricsFileCallback`, which every `Trainer`-based replayrl trainer
attaches; PPO and DDPO call it from their own loops), read back here; the figure is drawn by
`replayrl.metrics.plot` (`replayrl plot RUN_DIR`).

This module imports nothing heavy: reading a run needs neither torch nor transformers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "training.png"


def json_value(value: Any) -> Any:
    """Strict JSON: NaN and infinities become null; tensors and numpy scalars become Python numbers."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsFile:
    """The one writer of `metrics.jsonl`: appends ``{"step": step, **metrics}`` lines (strict JSON, see
    `json_value`); does nothing when not `enabled` (every process but the main one). `start(global_step)` begins a
    run: it keeps the lines up to a resumed run's step (all of them dropped on a fresh start), so the file reads
    as one run."""

    def __init__(self, path: str | Path, enabled: bool = True):
        self.path = Path(path)
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
        record = {"step": step, **{k: json_value(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl ([] if the file does not exist); blank lines are skipped."""
    path = Path(path)
    if not path.exists():
        return []
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, skipping records that lack it or hold null."""
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [s for s, _ in points], [v for _, v in points]


def _ends(values: list[float]) -> tuple[float, float, int]:
    """Means of the first and last k values, k = a fifth of them, between 1 and 5."""
    k = max(1, min(5, len(values) // 5))
    return sum(values[:k]) / k, sum(values[-k:]) / k, k


def summary_lines(records: list[dict]) -> list[str]:
    """What the run did, in a few lines: reward at the start vs the end, and the replay buffer's work."""
    lines = []
    for key, name in (("reward", "reward"), ("eval_reward", "eval reward")):
        _, values = series(records, key)
        if values:
            start, end, k = _ends(values)
            lines.append(f"{name}: {start:.3f} -> {end:.3f} (mean of the first / last {k} logs)")
    _, before = series(records, "frac_reward_zero_std")
    _, after = series(records, "replay/frac_zero_std_trained")
    if before:
        text = f"zero-std groups: {sum(before) / len(before):.2f} of generated groups"
        if after:
            text += f", {sum(after) / len(after):.2f} of trained groups after replay (run means)"
        lines.append(text)
    _, replaced = series(records, "replay/groups_replaced")
    _, size = series(records, "replay/buffer_size")
    if replaced:
        lines.append(
            f"replay: {sum(replaced) / len(replaced):.1f} buffered groups per batch, buffer held {size[-1]:.0f}"
        )
    return lines
