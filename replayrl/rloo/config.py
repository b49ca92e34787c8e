"""`RLOOConfig`: TRL 1.16's `RLOOConfig` fields and defaults, on top of replayrl's GRPO configuration.

RLOO shares GRPO's rollout, so the config is `GRPOWithReplayBufferConfig` with TRL's RLOO defaults
(`num_generations=2`, `beta=0.05`, `temperature=1.0`, `top_k=0`, `max_completion_length=512`, ...) and RLOO's two
own fields (`normalize_advantages`, `reward_clip_range`). The replay buffer is off by default
(`replay_buffer_size=0`, TRL has none) and available as for GRPO. GRPO's loss options that TRL's RLOOConfig does
not have (`loss_type`, `scale_rewards`, entropy bonus, ...) are refused at any value other than the one RLOO's loss
implies, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replayrl.replay.config import GRPOWithReplayBufferConfig
from replayrl.training_args import trl_bf16_default

# GRPO options with no meaning for RLOO's loss, and the only value accepted (the one that leaves them inactive).
_GRPO_ONLY = {
    "loss_type": "grpo",  # RLOO's loss is a mean over sequences: the 'grpo' token weights give exactly that
    "scale_rewards": "group",  # RLOO has normalize_advantages instead
    "multi_objective_aggregation": "sum_then_normalize",
    "importance_sampling_level": "token",  # RLOO's ratio is always per sequence (sum of token log-ratios)
    "delta": None,
    "sapo_temperature_pos": 1.0,
    "sapo_temperature_neg": 1.05,
    "vespo_k_pos": 2.0,
    "vespo_lambda_pos": 3.0,
    "vespo_k_neg": 3.0,
    "vespo_lambda_neg": 2.0,
    "top_entropy_quantile": 1.0,
    "entropy_coef": 0.0,
    "use_adaptive_entropy": False,
    "off_policy_mask_threshold": None,
    "use_bias_correction_kl": False,
}


@dataclass
class RLOOConfig(GRPOWithReplayBufferConfig):
    r"""Configuration for [`RLOOTrainer`]: TRL 1.16's `RLOOConfig` (same names and defaults) plus replayrl's
    GRPO/replay options that apply to RLOO (docs/rloo.md). Every field is also a `replayrl rloo --<field>` flag."""

    # TRL's RLOO-specific fields
    normalize_advantages: bool = field(
        default=False,
        metadata={"help": "Normalise the advantages over the generation batch to mean 0, std 1."},
    )
    reward_clip_range: list[float] | None = field(
        default=None, metadata={"help": "Clip the summed rewards to (min, max) before the KL penalty; None: no clip."}
    )
    # TRL's RLOO defaults where they differ from replayrl's GRPOConfig
    num_generations: int | None = field(default=2, metadata={"help": "Completions per prompt (G >= 2)."})
    max_completion_length: int | None = field(default=512, metadata={"help": "Maximum completion length in tokens."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    top_k: int | None = field(default=0, metadata={"help": "Top-k filtering; 0 (or None) disables it."})
    beta: float = field(
        default=0.05,
        metadata={"help": "KL coefficient: beta * sum_t (log pi - log pi_ref) is subtracted from each reward."},
    )
    vllm_server_timeout: float = field(default=240.0, metadata={"help": "Seconds to wait for the server to be up."})
    use_bias_correction_kl: bool = field(
        default=False, metadata={"help": "Fixed for RLOO (its KL is a reward penalty); GRPO's option, not TRL's."}
    )
    gradient_checkpointing: bool = field(
        default=True, metadata={"help": "Recompute activations in the backward pass (TRL's default: on)."}
    )
    bf16: bool | None = field(
        default=None, metadata={"help": "bf16 mixed precision; None (TRL): on unless fp16 is set, where bf16 can run."}
    )
    loss_type: str = field(default="grpo", metadata={"help": "Fixed for RLOO (a mean over sequences); not TRL's."})
    replay_buffer_size: int = field(
        default=0, metadata={"help": "Groups kept in the replay buffer (docs/replay.md). 0 (default): no buffer."}
    )

    def __post_init__(self):
        self.bf16 = trl_bf16_default(self.bf16, self.fp16, self.use_cpu)
        super().__post_init__()
        for name, accepted in _GRPO_ONLY.items():
            value = getattr(self, name)
            if value != accepted:
                raise ValueError(
                    f"{name}={value!r} is a GRPO option that TRL's RLOOConfig does not have: RLOO's loss is the "
                    f"sequence-level clipped REINFORCE leave-one-out loss. Leave {name} at {accepted!r} (or use "
                    "GRPOTrainer)."
                )
        clip = self.reward_clip_range
        if clip is not None and (len(clip) != 2 or clip[0] > clip[1]):
            raise ValueError(f"reward_clip_range must be (min, max) with min <= max (got {clip!r}).")
        if self.replay_buffer_size and self.replay_strategy != "group":
            raise ValueError(
                f"replay_strategy={self.replay_strategy!r} recomputes advantages with GRPO's formula; with RLOO only "
                "replay_strategy='group' is supported."
            )
