"""The replay buffer and the GRPO trainer that uses it."""

from replayrl.replay.buffer import ReplayBuffer, ReplayGroup, group_score
from replayrl.replay.trainer import GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer

__all__ = ["GRPOWithReplayBufferConfig", "GRPOWithReplayBufferTrainer", "ReplayBuffer", "ReplayGroup", "group_score"]
