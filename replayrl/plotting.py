"""The record of a run: `metrics.jsonl` (written while training), `training.png` (drawn from it) and the closing
summary that `replayrl grpo` prints. `replayrl plot RUN_DIR` re-draws the figure from the file alone.

The figure is drawn on a bare `matplotlib.figure.Figure` (Agg canvas), never through pyplot, so importing this
module neither needs a display nor changes the caller's matplotlib backend.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from transformers import TrainerCallback

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "training.png"

# (panel title, [(metric key, legend label)], note when none is logged); eval keys carry the Trainer's "eval_" prefix.
PANELS: list[tuple[str, list[tuple[str, str]], str]] = [
    ("Reward", [("reward", "train (fresh completions)"), ("eval_reward", "eval")], "no reward logged"),
    (
        "Zero-std groups (fraction of groups)",
        [("frac_reward_zero_std", "generated (before replacement)"), ("replay/frac_zero_std_trained", "trained on")],
        "not logged",
    ),
    (
        "Replay buffer",
        [("replay/buffer_size", "buffer size (groups)"), ("replay/groups_replaced", "groups replaced")],
        "not logged: replay buffer off",
    ),
    ("KL(policy || reference)", [("kl", "k3 estimate per token")], "not logged: beta = 0, no KL term"),
    ("Completion length (tokens)", [("completion_length", "mean")], "not logged"),
    ("Entropy (nats per token)", [("entropy", "mean")], "not logged"),
]


class MetricsFileCallback(TrainerCallback):
    """Appends every log (train and eval) to `metrics.jsonl` as one JSON object with its `step`; main process
    only. A resumed run keeps the lines up to the checkpoint's step, so the file reads as one run."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = (
            [r for r in read_metrics(self.path) if r.get("step", 0) <= state.global_step] if state.global_step else []
        )
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, **{k: _json_value(v) for k, v in logs.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def _json_value(value: Any) -> Any:
    """Strict JSON: NaN and infinities become null; tensors and numpy scalars become Python numbers."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


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


def plot_metrics(records: list[dict], path: str | Path, title: str = "") -> Path:
    """Draw the PANELS against optimizer step into a PNG at `path`. A panel none of whose metrics the run
    logged (`kl` with beta = 0, replay metrics with the buffer off) shows a note instead of a curve."""
    fig = Figure(figsize=(15, 8), layout="constrained")
    axes = fig.subplots(2, 3).ravel()
    for ax, (panel_title, lines, missing) in zip(axes, PANELS):
        drawn = 0
        for key, label in lines:
            steps, values = series(records, key)
            if steps:
                marker = "o" if key.startswith("eval_") or len(steps) < 30 else None
                ax.plot(steps, values, label=label, marker=marker, markersize=3)
                drawn += 1
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, missing, ha="center", va="center", transform=ax.transAxes)
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path


def plot_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Re-draw `RUN_DIR/training.png` (or `output`) from `RUN_DIR/metrics.jsonl`."""
    run_dir = Path(run_dir)
    metrics = run_dir / METRICS_FILE
    if not metrics.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir} (is it the output_dir of a `replayrl grpo` run?)")
    return plot_metrics(read_metrics(metrics), output or run_dir / PLOT_FILE, title=str(run_dir))


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
            text += f", {sum(after) / len(after):.2f} of trained groups after replacement (run means)"
        lines.append(text)
    _, replaced = series(records, "replay/groups_replaced")
    _, size = series(records, "replay/buffer_size")
    if replaced:
        lines.append(
            f"replay: {sum(replaced) / len(replaced):.1f} groups replaced per batch, buffer held {size[-1]:.0f}"
        )
    return lines
