"""Reward modelling (Bradley-Terry on preference pairs): config and trainer."""

from replayrl._lazy import lazy_exports

_EXPORTS = {
    "DataCollatorForPreference": "replayrl.data.preference",
    "RewardConfig": "replayrl.reward.config",
    "RewardTrainer": "replayrl.reward.trainer",
    "compute_accuracy": "replayrl.reward.trainer",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
