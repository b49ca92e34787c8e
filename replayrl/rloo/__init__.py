"""RLOO (REINFORCE Leave-One-Out, arXiv:2402.14740): TRL's `RLOOConfig` / `RLOOTrainer` on replayrl's GRPO."""

from replayrl._lazy import lazy_exports

_EXPORTS = {"RLOOConfig": "replayrl.rloo.config", "RLOOTrainer": "replayrl.rloo.trainer"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
