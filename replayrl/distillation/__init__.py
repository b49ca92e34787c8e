"""On-policy distillation (GKD, arXiv:2306.13649): TRL's `DistillationConfig` / `DistillationTrainer`."""

from replayrl._lazy import lazy_exports

_EXPORTS = {
    "DistillationConfig": "replayrl.distillation.config",
    "DistillationTrainer": "replayrl.distillation.trainer",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
