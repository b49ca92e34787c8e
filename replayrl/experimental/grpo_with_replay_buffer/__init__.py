"""`trl.experimental.grpo_with_replay_buffer`'s path: the same classes as `replayrl.replay`."""

from replayrl._lazy import lazy_exports

_EXPORTS = {
    "GRPOWithReplayBufferConfig": "replayrl.replay.config",
    "GRPOWithReplayBufferTrainer": "replayrl.replay.trainer",
    "ReplayBuffer": "replayrl.replay.buffer",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
