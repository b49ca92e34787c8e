"""Pure tensor math for GRPO: advantages, KL estimators, token log-probs and policy losses (torch only)."""

from replayrl.algos.advantages import group_advantages, group_rewards_view, group_std, zero_std_groups
from replayrl.algos.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3
from replayrl.algos.logprobs import entropy_from_logits, selective_log_softmax, token_logps_and_entropy
from replayrl.algos.losses import (
    LossType,
    clipped_surrogate,
    masked_mean,
    token_weights,
    truncated_is_weights,
)
from replayrl.algos.mismatch import IS_MODES, engine_is_weights, logp_difference

__all__ = [
    "IS_MODES",
    "engine_is_weights",
    "logp_difference",
    "KL_ESTIMATORS",
    "LossType",
    "clipped_surrogate",
    "entropy_from_logits",
    "group_advantages",
    "group_rewards_view",
    "group_std",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "masked_mean",
    "selective_log_softmax",
    "token_logps_and_entropy",
    "token_weights",
    "truncated_is_weights",
    "zero_std_groups",
]
