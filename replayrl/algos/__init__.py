"""Pure tensor math for GRPO: advantages, KL estimators, token log-probs and policy losses (torch only)."""

from replayrl.algos.advantages import (
    group_advantages,
    group_rewards_view,
    group_std,
    normalize_then_sum_advantages,
    zero_std_groups,
)
from replayrl.algos.entropy import adaptive_entropy_coef, applied_entropy_coef, entropy_threshold, high_entropy_mask
from replayrl.algos.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3
from replayrl.algos.logprobs import (
    TokenStats,
    chunked_token_stats,
    entropy_from_logits,
    linear_cross_entropy,
    selective_log_softmax,
    token_logps_and_entropy,
)
from replayrl.algos.losses import (
    GLOBAL_TOKEN_MEAN_LOSSES,
    LossType,
    clipped_surrogate,
    masked_mean,
    token_weights,
    truncated_is_weights,
)
from replayrl.algos.mismatch import IS_MODES, engine_is_weights, logp_difference
from replayrl.algos.policy_losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    POLICY_LOSSES,
    TOKEN_LEVEL_ONLY,
    PolicyLoss,
    PolicyLossParams,
    importance_corrected_kl,
    importance_log_weights,
    off_policy_sequence_mask,
    policy_loss,
    sapo_gate,
    vespo_weights,
)

__all__ = [
    "IS_MODES",
    "engine_is_weights",
    "logp_difference",
    "GLOBAL_TOKEN_MEAN_LOSSES",
    "IMPORTANCE_SAMPLING_LEVELS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "TOKEN_LEVEL_ONLY",
    "LossType",
    "PolicyLoss",
    "PolicyLossParams",
    "adaptive_entropy_coef",
    "applied_entropy_coef",
    "clipped_surrogate",
    "entropy_from_logits",
    "chunked_token_stats",
    "linear_cross_entropy",
    "TokenStats",
    "entropy_threshold",
    "group_advantages",
    "group_rewards_view",
    "group_std",
    "high_entropy_mask",
    "importance_corrected_kl",
    "importance_log_weights",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "masked_mean",
    "normalize_then_sum_advantages",
    "off_policy_sequence_mask",
    "policy_loss",
    "sapo_gate",
    "selective_log_softmax",
    "token_logps_and_entropy",
    "token_weights",
    "truncated_is_weights",
    "vespo_weights",
    "zero_std_groups",
]
