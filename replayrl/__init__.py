"""replayrl: GRPO with a replay buffer, done right. TRL-compatible trainers for RL post-training of LMs.

The public API is lazy (PEP 562): `import replayrl` imports neither torch nor transformers; each name below
is imported on first use, so `from replayrl import GRPOTrainer` costs what that trainer needs, no more.
"""

from replayrl._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "DDPOConfig": "replayrl.ddpo.config",
    "DDPOStableDiffusionPipeline": "replayrl.ddpo.pipeline",
    "DDPOTrainer": "replayrl.ddpo.trainer",
    "DefaultDDPOStableDiffusionPipeline": "replayrl.ddpo.pipeline",
    "DPOConfig": "replayrl.dpo.config",
    "DPOTrainer": "replayrl.dpo.trainer",
    "RewardConfig": "replayrl.reward.config",
    "RewardTrainer": "replayrl.reward.trainer",
    "GRPOConfig": "replayrl.grpo.config",
    "GRPOTrainer": "replayrl.grpo.trainer",
    "GRPOWithReplayBufferConfig": "replayrl.replay.config",
    "GRPOWithReplayBufferTrainer": "replayrl.replay.trainer",
    "ReplayBuffer": "replayrl.replay.buffer",
    "SFTConfig": "replayrl.sft.config",
    "SFTTrainer": "replayrl.sft.trainer",
    "AutoModelForCausalLMWithValueHead": "replayrl.models.value_head",
    "AutoModelForSeq2SeqLMWithValueHead": "replayrl.models.value_head",
    "create_reference_model": "replayrl.models.value_head",
    "PPOConfig": "replayrl.ppo.config",
    "PPOTrainer": "replayrl.ppo.trainer",
    "DistillationConfig": "replayrl.distillation.config",
    "DistillationTrainer": "replayrl.distillation.trainer",
    "KTOConfig": "replayrl.kto.config",
    "KTOTrainer": "replayrl.kto.trainer",
    "RLOOConfig": "replayrl.rloo.config",
    "RLOOTrainer": "replayrl.rloo.trainer",
    "clone_chat_template": "replayrl.data.chat_template",
    "is_conversational_from_value": "replayrl.data.formats",
    "maybe_convert_to_chatml": "replayrl.data.formats",
    "set_seed": "transformers.trainer_utils",  # TRL v0.7 exports it (random, numpy, torch and every device)
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
