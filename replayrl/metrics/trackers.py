"""What replayrl sends to the trackers of `report_to` beyond transformers' own callbacks.

transformers' callbacks already send every log (the rows of `metrics.jsonl`) to TensorBoard, trackio, wandb and
the rest, with `train/` or `eval/` prefixes. Two things are added here:
- the end-of-run summary (`train_runtime`, `train_loss`, ...): transformers' `TrackioCallback` drops it, so
  `TrackerSummaryCallback` logs it to trackio itself, with `train/global_step` as every trackio row has;
- the completions table of `log_completions` (GRPO and the trainers built on it): as a `trackio.Table` and a
  `wandb.Table` under `completions` (as TRL; with `train/global_step`, the step axis transformers gives both; the
  prompt images of a VLM run in an `image` column of `trackio.Image` / `wandb.Image`), and to TensorBoard, which
  has no tables, as a markdown table in a text summary under `completions` (one per log; images as their sizes).

Trackers are optional extras (`pip install 'replayrl[trackers]'`), imported only where used.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

# The keys transformers' TrackioCallback leaves out (its `single_value_scalars`).
SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos")


def reports_to(args: Any, name: str) -> bool:
    report_to = getattr(args, "report_to", None) or []
    return name in ([report_to] if isinstance(report_to, str) else report_to)


class TrackerSummaryCallback(TrainerCallback):
    """Logs the end-of-run summary to trackio, which transformers' TrackioCallback leaves out (main process)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        summary = {f"train/{k}": v for k, v in (logs or {}).items() if k in SUMMARY_KEYS}
        if summary and state.is_world_process_zero and reports_to(args, "trackio"):
            import trackio

            if trackio.context_vars.current_run.get() is not None:
                trackio.log({**summary, "train/global_step": state.global_step})


def markdown_table(table: dict[str, list]) -> str:
    """The table as markdown (TensorBoard renders it); `|` and newlines in cells are escaped."""

    def cell(value: Any) -> str:
        if isinstance(value, list) and value and hasattr(value[0], "width"):  # a row's images: their sizes
            value = ", ".join(f"image {im.width}x{im.height}" for im in value)
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

    header = "| " + " | ".join(table) + " |\n|" + "---|" * len(table) + "\n"
    rows = ["| " + " | ".join(cell(v) for v in values) + " |" for values in zip(*table.values())]
    return header + "\n".join(rows)


def log_completions_table(trainer: Any, table: dict[str, list]) -> None:
    """Send the completions table (every process's rows, column -> values) to the trackers of `report_to`;
    call on the main process."""
    args, step = trainer.args, trainer.state.global_step
    if reports_to(args, "tensorboard"):
        from transformers.integrations import TensorBoardCallback

        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, TensorBoardCallback) and callback.tb_writer is not None:
                callback.tb_writer.add_text("completions", markdown_table(table), step)
                callback.tb_writer.flush()
    if not (reports_to(args, "trackio") or reports_to(args, "wandb")):
        return
    if reports_to(args, "trackio"):
        import trackio

        if trackio.context_vars.current_run.get() is not None:
            frame = _frame(table, trackio)
            trackio.log({"completions": trackio.Table(dataframe=frame), "train/global_step": step})
    if reports_to(args, "wandb"):
        import wandb

        if wandb.run is not None:
            wandb.log({"completions": wandb.Table(dataframe=_frame(table, wandb)), "train/global_step": step})


def _frame(table: dict[str, list], backend: Any):
    """The table as a pandas DataFrame; an ``image`` column (each row's PIL images) as the tracker's own images
    (``backend.Image``), as TRL logs them."""
    import pandas as pd

    if "image" in table:
        table = {**table, "image": [[backend.Image(im) for im in images or []] for images in table["image"]]}
    return pd.DataFrame(table)
