"""`MetricsFileCallback`: appends every log of a run to `output_dir/metrics.jsonl` (main process only)."""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerCallback

from replayrl.metrics import METRICS_FILE, MetricsFile


class MetricsFileCallback(TrainerCallback):
    """Appends every log (train and eval) to `metrics.jsonl` as one JSON object with its `step`; main process
    only. A resumed run keeps the lines up to the checkpoint's step, so the file reads as one run."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def on_train_begin(self, args, state, control, **kwargs):
        MetricsFile(self.path, state.is_world_process_zero).start(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            MetricsFile(self.path, state.is_world_process_zero).write(state.global_step, logs)


def attach_metrics_file(trainer) -> None:
    """Give `trainer` a MetricsFileCallback writing to its `output_dir`, unless it already has one (and, with
    trackio in `report_to`, the `TrackerSummaryCallback`)."""
    if not any(isinstance(cb, MetricsFileCallback) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(MetricsFileCallback(Path(trainer.args.output_dir) / METRICS_FILE))
    from replayrl.metrics.trackers import TrackerSummaryCallback, reports_to

    if reports_to(trainer.args, "trackio"):  # the end-of-run summary transformers' TrackioCallback drops
        trainer.add_callback(TrackerSummaryCallback())
