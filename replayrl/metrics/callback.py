"""`MetricsFileCallback`: appends every log of a run to `output_dir/metrics.jsonl` (main process only)."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import TrainerCallback

from replayrl.metrics import METRICS_FILE, json_value, read_metrics


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
        record = {"step": state.global_step, **{k: json_value(v) for k, v in logs.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def attach_metrics_file(trainer) -> None:
    """Give `trainer` a MetricsFileCallback writing to its `output_dir`, unless it already has one."""
    if not any(isinstance(cb, MetricsFileCallback) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(MetricsFileCallback(Path(trainer.args.output_dir) / METRICS_FILE))
