"""The replay buffer (plain torch) and the GRPO trainer that uses it."""

from replayrl._lazy import lazy_exports

_EXPORTS = {
    "ReplayBuffer": "replayrl.replay.buffer",
    "ReplayGroup": "replayrl.replay.buffer",
    "group_score": "replayrl.replay.buffer",
    "GRPOWithReplayBufferConfig": "replayrl.replay.config",
    "GRPOWithReplayBufferTrainer": "replayrl.replay.trainer",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
