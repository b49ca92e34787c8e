"""The `GRPOConfig` fields of TRL 1.16 beyond TRL 0.16's (the GRPO API this project started from), with TRL's
names and defaults, and their checks.

Kept apart from `config.py` so the options added for TRL parity live in one place; `GRPOConfig` inherits them.
Every field here is implemented (see docs/grpo.md), or refused with a ValueError naming why when set to a
non-default value (never accepted and ignored).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments

from replayrl.algos.losses import check_loss_options
from replayrl.algos.policy_losses import IMPORTANCE_SAMPLING_LEVELS
from replayrl.training_args import check_pad_to_multiple_of, resolve_pad_to_multiple_of

MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class TRLParityArguments:
    """Options of current TRL's `GRPOConfig` that TRL 0.16 predates."""

    _VALID_DICT_FIELDS = TrainingArguments._VALID_DICT_FIELDS + [
        "generation_kwargs",
        "chat_template_kwargs",
        "transformers_continuous_batching_config",
    ]

    # Model
    trust_remote_code: bool = field(
        default=False, metadata=_help("Allow custom modelling code when loading the model/tokenizer by name.")
    )
    disable_dropout: bool = field(default=False, metadata=_help("Set every dropout probability of the policy to 0."))
    cast_lm_head_to_fp32: bool = field(
        default=False,
        metadata=_help("Run the LM head in float32 (ScaleRL, arXiv:2510.13786). Needs untied embeddings."),
    )
    router_aux_loss_coef: float | None = field(
        default=None,
        metadata=_help(
            "MoE router auxiliary-loss coefficient; None (TRL): the model config's own `router_aux_loss_coef` (0.0 "
            "when it declares none). The loss is added when the model config has output_router_logits=True."
        ),
    )
    # Data / generation
    num_generations_eval: int | None = field(
        default=None, metadata=_help("Completions per prompt during evaluation; None: num_generations.")
    )
    pad_to_multiple_of: int | str | None = field(
        default="auto",
        metadata=_help(
            "Pad prompt and completion widths to a multiple of this (fixed shapes); 'auto' (TRL): 128 on Neuron "
            "only, so no padding here (None)."
        ),
    )
    generation_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata=_help("Extra GenerationConfig keyword arguments; they override the other generation options."),
    )
    chat_template_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata=_help("Extra keyword arguments for apply_chat_template (e.g. enable_thinking).")
    )
    use_transformers_paged: bool = field(
        default=False, metadata=_help("Deprecated (as TRL): sets use_transformers_continuous_batching=True.")
    )
    use_transformers_continuous_batching: bool = field(
        default=False,
        metadata=_help("Generate with transformers' continuous batching (generate_batch, paged KV cache)."),
    )
    transformers_continuous_batching_config: dict | str | None = field(
        default=None,
        metadata=_help("transformers ContinuousBatchingConfig keyword arguments (max_memory_percent defaults to 0.5)."),
    )
    # Loss
    delta: float | None = field(
        default=None,
        metadata=_help(
            "Two-sided clipping (INTELLECT-2, arXiv:2505.07291): cap the unclipped ratio at delta (> 1+eps)."
        ),
    )
    sapo_temperature_neg: float = field(default=1.05, metadata=_help("SAPO gate temperature where A <= 0."))
    sapo_temperature_pos: float = field(default=1.0, metadata=_help("SAPO gate temperature where A > 0."))
    vespo_k_pos: float = field(default=2.0, metadata=_help("VESPO gamma shape k for A >= 0."))
    vespo_lambda_pos: float = field(default=3.0, metadata=_help("VESPO gamma rate lambda for A >= 0."))
    vespo_k_neg: float = field(default=3.0, metadata=_help("VESPO gamma shape k for A < 0."))
    vespo_lambda_neg: float = field(default=2.0, metadata=_help("VESPO gamma rate lambda for A < 0."))
    importance_sampling_level: str = field(
        default="token",
        metadata=_help("'token': one ratio per token; 'sequence': GSPO (arXiv:2507.18071), one ratio per sequence."),
    )
    multi_objective_aggregation: str = field(
        default="sum_then_normalize",
        metadata=_help(
            "'sum_then_normalize': weighted sum of rewards, then scale_rewards; 'normalize_then_sum' (GDPO, "
            "arXiv:2601.05242): normalise each reward within its group, weighted sum, then normalise over the batch."
        ),
    )
    top_entropy_quantile: float = field(
        default=1.0,
        metadata=_help("Train only on the top-rho fraction of tokens by entropy (arXiv:2506.01939); 1.0 keeps all."),
    )
    entropy_coef: float = field(default=0.0, metadata=_help("Entropy bonus: loss -= entropy_coef * mean entropy."))
    use_adaptive_entropy: bool = field(
        default=False, metadata=_help("Adapt entropy_coef each step towards keeping entropy above entropy_target.")
    )
    entropy_coef_min: float = field(default=0.0, metadata=_help("Lower bound of the adaptive entropy_coef."))
    entropy_coef_max: float = field(default=1.0, metadata=_help("Upper bound of the adaptive entropy_coef."))
    entropy_coef_delta: float = field(default=0.005, metadata=_help("Adaptive entropy_coef step per optimizer step."))
    entropy_target: float = field(default=0.2, metadata=_help("Adaptive mode: mean token entropy (nats) to defend."))
    off_policy_mask_threshold: float | None = field(
        default=None,
        metadata=_help("Drop sequences with A < 0 and mean KL(behaviour||policy) > threshold (DeepSeek-V3.2)."),
    )
    use_bias_correction_kl: bool = field(
        default=True,
        metadata=_help(
            "Multiply the KL term by the importance ratio (DeepSeek-V3.2, arXiv:2512.02556): the unbiased reverse-KL "
            "gradient (TRL's default). Changes the KL gradient whenever beta != 0, even on-policy."
        ),
    )
    # Tools
    max_tool_calling_iterations: int | None = field(
        default=None, metadata=_help("Maximum tool-calling turns per completion; None: until no tool call.")
    )
    # Logging
    log_unique_prompts: bool = field(default=False, metadata=_help("Completions table: one row per unique prompt."))
    log_multimodal: bool = field(default=True, metadata=_help("Log the prompt images with log_completions."))
    log_completions_hub_repo: str | None = field(default=None, metadata=_help("Hub upload of completions (refused)."))


def _refusals(cfg) -> list[tuple[bool, str]]:
    return [
        (
            cfg.log_completions_hub_repo is not None,
            f"log_completions_hub_repo={cfg.log_completions_hub_repo!r}: replayrl never uploads to the Hub "
            "(offline by design); completions go to the log / metrics.jsonl. Leave it None.",
        ),
        (
            getattr(cfg, "use_liger_kernel", False),
            "use_liger_kernel=True: replayrl's GRPO loss is not wired to Liger's fused kernel (it needs Triton on "
            "a CUDA GPU and would bypass the per-token weights of every loss_type here). Set use_liger_kernel=False.",
        ),
    ]


def validate_parity(cfg) -> None:
    """Checks of the fields above (called from `GRPOConfig._validate`)."""
    cfg.pad_to_multiple_of = resolve_pad_to_multiple_of(cfg.pad_to_multiple_of)
    check_pad_to_multiple_of(cfg.pad_to_multiple_of)
    if cfg.use_transformers_paged:
        warnings.warn(
            "use_transformers_paged is deprecated (as in TRL): use use_transformers_continuous_batching.",
            FutureWarning,
            stacklevel=3,
        )
        cfg.use_transformers_continuous_batching = True
    for name in ("generation_kwargs", "chat_template_kwargs", "transformers_continuous_batching_config"):
        value = getattr(cfg, name)
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{name} must be a dict or a JSON object string (got {value!r}).")
    for bad, message in _refusals(cfg):
        if bad:
            raise ValueError(message)
    level, agg = cfg.importance_sampling_level, cfg.multi_objective_aggregation
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS} (got {level!r}).")
    check_loss_options(cfg.loss_type, level, cfg.delta)  # the loss type's own rules (algos.GRPO_LOSSES)
    checks = [
        (
            agg in MULTI_OBJECTIVE_AGGREGATIONS,
            f"multi_objective_aggregation must be one of {MULTI_OBJECTIVE_AGGREGATIONS} (got {agg!r}).",
        ),
        (
            not (agg == "normalize_then_sum" and cfg.scale_rewards == "mean"),
            "scale_rewards='mean' only works with multi_objective_aggregation='sum_then_normalize'.",
        ),
        (
            cfg.delta is None or cfg.delta > 1 + cfg.epsilon_high,
            f"delta ({cfg.delta}) must be > 1 + epsilon_high ({1 + cfg.epsilon_high}), or None.",
        ),
        (cfg.sapo_temperature_pos > 0 and cfg.sapo_temperature_neg > 0, "sapo_temperature_pos/neg must be > 0."),
        (
            0.0 <= cfg.top_entropy_quantile <= 1.0,
            f"top_entropy_quantile must be in [0, 1] (got {cfg.top_entropy_quantile}).",
        ),
        (cfg.entropy_coef >= 0, f"entropy_coef must be >= 0 (got {cfg.entropy_coef})."),
        (cfg.entropy_coef_min <= cfg.entropy_coef_max, "entropy_coef_min must be <= entropy_coef_max."),
        (
            cfg.off_policy_mask_threshold is None or cfg.off_policy_mask_threshold > 0,
            "off_policy_mask_threshold must be > 0 or None.",
        ),
        (
            cfg.max_tool_calling_iterations is None or cfg.max_tool_calling_iterations >= 0,
            "max_tool_calling_iterations must be >= 0 or None.",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    _validate_eval_generations(cfg)


def _validate_eval_generations(cfg) -> None:
    g = cfg.num_generations_eval
    if g is None:
        return
    if g < 1:
        raise ValueError(f"num_generations_eval must be >= 1 (got {g}).")
    from replayrl.grpo.checks import check_eval_batch

    check_eval_batch(cfg)  # with num_generations alone, checked when the trainer is given an eval_dataset
