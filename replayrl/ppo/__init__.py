"""PPO with a value head, TRL v0.7.1's API: `PPOConfig`, `PPOTrainer` (step / generate / log_stats,
plus a managed `train()`)."""

from replayrl._lazy import lazy_exports

_EXPORTS = {
    "PPOConfig": "replayrl.ppo.config",
    "PPOTrainer": "replayrl.ppo.trainer",
    "LengthSampler": "replayrl.ppo.trainer",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
