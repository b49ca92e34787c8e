"""GRPO (arXiv:2402.03300): config, trainer, the Rollout record a batch travels in, and the group sampler."""

from replayrl._lazy import lazy_exports

_EXPORTS = {
    "GRPOConfig": "replayrl.grpo.config",
    "GRPOTrainer": "replayrl.grpo.trainer",
    "Rollout": "replayrl.grpo.rollout",
    "RepeatSampler": "replayrl.grpo.sampler",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
