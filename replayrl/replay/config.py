"""`GRPOWithReplayBufferConfig`: `GRPOConfig` plus the replay buffer's knobs (docs/replay.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from replayrl.grpo.config import GRPOConfig


@dataclass
class GRPOWithReplayBufferConfig(GRPOConfig):
    """[`GRPOConfig`] plus the replay buffer's knobs."""

    replay_buffer_size: int = field(
        default=64,
        metadata={"help": "Groups kept in the replay buffer. 0 disables the buffer (plain GRPO)."},
    )
    replay_score: Literal["adv_std", "variance", "uniform"] = field(
        default="adv_std",
        metadata={"help": "Group priority: 'adv_std' (sum|A|*std, TRL), 'variance' (p(1-p) for 0/1), 'uniform'."},
    )
    replay_zero_std_atol: float = field(
        default=1e-6, metadata={"help": "A group is zero-std when max(r) - min(r) <= this tolerance."}
    )
    replay_max_age: int | None = field(
        default=10,
        metadata={"help": "Evict groups generated more than this many optimizer steps ago (None: no bound)."},
    )
    replay_max_reuse: int | None = field(
        default=None, metadata={"help": "Evict a group after it has been replayed this many times (None: no bound)."}
    )
    replay_strategy: Literal["group", "mix", "mix_then_group"] = field(
        default="group",
        metadata={
            "help": "'group': zero-std groups earn buffered data (replay_placement); 'mix': the prompt's stored "
            "success joins its group (ExGRPO); 'mix_then_group': both."
        },
    )
    replay_placement: Literal["replace", "append"] = field(
        default="append",
        metadata={
            "help": "'append': fresh groups all stay, buffered data is added (arXiv 2606.04560); 'replace': "
            "swapped in (TRL's)."
        },
    )
    replay_unit: Literal["group", "rollout"] = field(
        default="rollout",
        metadata={
            "help": "replay_placement='append': per zero-std group, G buffered rollouts ('rollout') or one buffered "
            "group ('group')."
        },
    )
    replay_rollout_priority: Literal["positive_advantage", "abs_advantage"] = field(
        default="positive_advantage",
        metadata={"help": "replay_unit='rollout': rollouts drawn in proportion to max(A, 0) or to |A|."},
    )
    replay_importance_cap: float | None = field(
        default=2.0,
        metadata={
            "help": "Replayed rows: ratio against the current policy, times min(pi/mu, cap) (arXiv:2110.00641). "
            "None: PPO ratio against mu, clipped."
        },
    )

    replay_m2_threshold: float | None = field(
        default=None,
        metadata={
            "help": "If set, replayed rows use M2PO's trust region (arXiv:2510.01161): ratio against the current "
            "policy times the importance weight pi/mu (truncated at replay_importance_cap if set), with the "
            "replayed tokens of largest (log pi/mu)^2 masked until their mean is <= this (paper: 0.04)."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.replay_buffer_size < 0:
            raise ValueError(f"replay_buffer_size must be >= 0 (got {self.replay_buffer_size}); 0 disables it.")
        if self.replay_score not in ("adv_std", "variance", "uniform"):
            raise ValueError(f"replay_score must be 'adv_std', 'variance' or 'uniform' (got {self.replay_score!r}).")
        if self.replay_strategy not in ("group", "mix", "mix_then_group"):
            raise ValueError(
                f"replay_strategy must be 'group', 'mix' or 'mix_then_group' (got {self.replay_strategy!r})."
            )
        if self.replay_placement not in ("replace", "append"):
            raise ValueError(f"replay_placement must be 'replace' or 'append' (got {self.replay_placement!r}).")
        if self.replay_unit not in ("group", "rollout"):
            raise ValueError(f"replay_unit must be 'group' or 'rollout' (got {self.replay_unit!r}).")
        if self.replay_rollout_priority not in ("abs_advantage", "positive_advantage"):
            raise ValueError(
                "replay_rollout_priority must be 'abs_advantage' or 'positive_advantage' "
                f"(got {self.replay_rollout_priority!r})."
            )
        for name in ("replay_max_age", "replay_max_reuse"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None (got {value}).")
        if self.replay_m2_threshold is not None and self.replay_m2_threshold <= 0:
            raise ValueError(f"replay_m2_threshold must be > 0 or None (got {self.replay_m2_threshold}); paper: 0.04.")
        if self.replay_importance_cap is not None and self.replay_importance_cap <= 0:
            raise ValueError(f"replay_importance_cap must be > 0 (got {self.replay_importance_cap}).")
