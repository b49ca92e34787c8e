"""replayrl: GRPO with a replay buffer, done right. TRL-compatible trainers for RL post-training of LMs."""

from replayrl.config import GRPOConfig
from replayrl.replay import GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer, ReplayBuffer
from replayrl.trainer import GRPOTrainer

__all__ = ["GRPOConfig", "GRPOTrainer", "GRPOWithReplayBufferConfig", "GRPOWithReplayBufferTrainer", "ReplayBuffer"]
__version__ = "0.1.0"
