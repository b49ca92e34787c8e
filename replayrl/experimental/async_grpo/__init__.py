"""`trl.experimental.async_grpo`'s path: `AsyncGRPOConfig` / `AsyncGRPOTrainer` (replayrl.grpo.async_trainer)."""

from replayrl._lazy import lazy_exports

_EXPORTS = {
    "AsyncGRPOConfig": "replayrl.grpo.async_trainer",
    "AsyncGRPOTrainer": "replayrl.grpo.async_trainer",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
