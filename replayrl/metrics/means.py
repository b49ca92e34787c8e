"""`MeanMetricsMixin`: a Trainer's own metrics, recorded per micro-batch and logged as means."""

from __future__ import annotations

from collections import defaultdict


class MeanMetricsMixin:
    """Values appended to ``self._metrics[mode][key]`` ("train" / "eval") since the last log are added to the logs as
    their mean (``eval_``-prefixed in evaluation), then cleared. Put it before `transformers.Trainer` in the bases."""

    def _init_metrics(self) -> None:
        self._metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        prefix = "eval_" if mode == "eval" else ""
        logs.update({prefix + k: sum(v) / len(v) for k, v in self._metrics[mode].items() if v})
        self._metrics[mode].clear()
        super().log(logs, start_time)
