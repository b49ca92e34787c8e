"""`GRPOConfig`: TRL's GRPO parameters on top of `transformers.TrainingArguments`, validated once.

Names and defaults follow TRL 0.16's GRPO documentation; the options that
TRL added later (`loss_type`, `scale_rewards` as a string, `mask_truncated_completions`,
`generation_batch_size` / `steps_per_generation`) follow current TRL. Deviations are listed in
`docs/deviations.md`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from replayrl.algos.losses import GRPO_LOSSES, LENGTH_WEIGHTED_LOSSES, grpo_loss
from replayrl.grpo.config_parity import TRLParityArguments, validate_parity
from replayrl.training_args import TrainingArguments

SCALE_REWARDS = ("group", "batch", "none", "mean")


logger = logging.getLogger(__name__)


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class GRPOConfig(TRLParityArguments, TrainingArguments):
    r"""Configuration for [`GRPOTrainer`]. Only the GRPO-specific parameters are listed; the rest are
    `transformers.TrainingArguments`. Every field is also a `replayrl grpo --<field>` flag.
    """

    # Model
    model_init_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata=_help("Keyword arguments for `from_pretrained` when `model` is a name or path.")
    )
    # Data
    remove_unused_columns: bool | None = field(
        default=False,
        metadata=_help("Keep only the `prompt` column. Leave False if reward functions read other columns."),
    )
    max_prompt_length: int | None = field(
        default=512, metadata=_help("Maximum prompt length in tokens; longer prompts are truncated on the left.")
    )
    num_generations: int | None = field(
        default=8,
        metadata=_help(
            "Completions per prompt (G). Each process's generation batch (per_device_train_batch_size * "
            "steps_per_generation) must be divisible by it, so that groups never straddle processes."
        ),
    )
    max_completion_length: int | None = field(default=256, metadata=_help("Maximum completion length in tokens."))
    ds3_gather_for_generation: bool = field(
        default=True,
        metadata=_help(
            "DeepSpeed ZeRO-3: gather the policy's weights once per generation batch (False: keep them partitioned, "
            "fetched layer by layer in every decoding step; less memory, slower)."
        ),
    )
    shuffle_dataset: bool = field(default=True, metadata=_help("Shuffle the training prompts."))
    # Generation
    generation_batch_size: int | None = field(
        default=None,
        metadata=_help("Global number of completions generated at once. Mutually exclusive with steps_per_generation."),
    )
    steps_per_generation: int | None = field(
        default=None,
        metadata=_help(
            "Micro-batches (per process) served by one generation. Defaults to gradient_accumulation_steps."
        ),
    )
    temperature: float = field(default=0.9, metadata=_help("Sampling temperature."))
    top_p: float = field(default=1.0, metadata=_help("Nucleus sampling probability mass, in (0, 1]."))
    top_k: int | None = field(default=50, metadata=_help("Top-k filtering; None disables it."))
    min_p: float | None = field(default=None, metadata=_help("Minimum token probability relative to the top token."))
    repetition_penalty: float = field(default=1.0, metadata=_help("Repetition penalty (>1 discourages repeats)."))
    cache_implementation: str | None = field(default=None, metadata=_help("KV-cache implementation for generate."))
    # vLLM (docs/vllm.md): generation by an in-process engine ("colocate") or a `replayrl vllm-serve` server
    use_vllm: bool = field(default=False, metadata=_help("Generate with vLLM (`pip install replayrl[vllm]`)."))
    vllm_mode: Literal["colocate", "server"] = field(
        default="colocate", metadata=_help("'colocate': in-process engine; 'server': a `replayrl vllm-serve` server.")
    )
    vllm_server_base_url: str | None = field(
        default=None, metadata=_help("Server URL (e.g. http://127.0.0.1:8000); overrides host and port.")
    )
    vllm_server_host: str = field(default="0.0.0.0", metadata=_help("vLLM server host (0.0.0.0 = this machine)."))
    vllm_server_port: int = field(default=8000, metadata=_help("vLLM server port."))
    vllm_server_timeout: float = field(default=120.0, metadata=_help("Seconds to wait for the server to be up."))
    vllm_gpu_memory_utilization: float = field(
        default=0.3, metadata=_help("Colocate: GPU memory share for vLLM; on CPU the cap on the KV cache's RAM share.")
    )
    vllm_tensor_parallel_size: int = field(default=1, metadata=_help("Colocate: tensor-parallel size."))
    vllm_max_model_length: int | None = field(
        default=None, metadata=_help("Colocate: engine context length (default max_prompt + max_completion length).")
    )
    vllm_model_impl: str = field(default="vllm", metadata=_help("Model implementation: 'vllm' or 'transformers'."))
    vllm_enable_sleep_mode: bool = field(default=False, metadata=_help("Colocate on GPU: offload between steps."))
    vllm_guided_decoding_regex: str | None = field(default=None, metadata=_help("vLLM guided decoding regex."))
    vllm_structured_outputs_regex: str | None = field(
        default=None, metadata=_help("vLLM structured-outputs regex (TRL's newer name); not supported yet.")
    )
    vllm_group_port: int = field(
        default=51216,
        metadata=_help("TRL's NCCL weight-update port; replayrl syncs a server through files, so it must stay 51216."),
    )
    vllm_importance_sampling_correction: bool = field(
        default=True, metadata=_help("Reweight tokens by pi_trainer / pi_vllm (truncated importance sampling).")
    )
    vllm_importance_sampling_mode: str = field(
        default="sequence_mask",
        metadata=_help("'token_truncate', 'token_mask', 'sequence_truncate' or 'sequence_mask' (TRL's modes)."),
    )
    vllm_importance_sampling_clip_max: float | None = field(
        default=3.0, metadata=_help("C_max: ratios above it are truncated to it (*_truncate) or zeroed (*_mask).")
    )
    vllm_importance_sampling_clip_min: float | None = field(
        default=None, metadata=_help("C_min: ratios below it are raised to it (*_truncate) or zeroed (*_mask).")
    )
    vllm_importance_sampling_cap: float | None = field(
        default=None, metadata=_help("Deprecated (TRL): the same as vllm_importance_sampling_clip_max.")
    )
    # Training
    learning_rate: float = field(default=1e-6, metadata=_help("AdamW learning rate (GRPO default 1e-6)."))
    logging_steps: float = field(default=10, metadata=_help("Log every N optimizer steps."))
    beta: float = field(
        default=0.04, metadata=_help("KL coefficient. 0 disables the KL term and loads no reference model.")
    )
    num_iterations: int = field(default=1, metadata=_help("Optimisation passes per generation (mu in the paper)."))
    epsilon: float = field(default=0.2, metadata=_help("Lower clipping bound: ratio >= 1 - epsilon."))
    epsilon_high: float | None = field(
        default=None, metadata=_help("Upper clipping bound (1 + epsilon_high); defaults to epsilon. DAPO uses 0.28.")
    )
    reward_weights: list[float] | None = field(
        default=None, metadata=_help("One weight per reward function; default all 1.0.")
    )
    scale_rewards: str = field(
        default="group",
        metadata=_help(
            "Advantage scaling: 'group' (True) divides by the group std, 'batch' by the batch std, "
            "'none' (False) does not scale (Dr. GRPO)."
        ),
    )
    loss_type: str = field(
        default="dapo",
        metadata=_help(
            "The per-token loss and its aggregation over tokens (algos.GRPO_LOSSES, docs/grpo.md): "
            + "; ".join(
                f"'{name}' ({loss.source}: {loss.aggregation.description})" for name, loss in GRPO_LOSSES.items()
            )
            + "."
        ),
    )
    mask_truncated_completions: bool = field(
        default=False, metadata=_help("Exclude completions that hit max_completion_length from the loss.")
    )
    sync_ref_model: bool = field(default=False, metadata=_help("TR-DPO: periodically mix the policy into the ref."))
    ref_model_mixup_alpha: float = field(default=0.6, metadata=_help("TR-DPO alpha: ref = a*policy + (1-a)*ref."))
    ref_model_sync_steps: int = field(default=512, metadata=_help("TR-DPO tau: sync every N optimizer steps."))
    # Dynamic sampling (DAPO, arXiv:2503.14476; verl: algorithm.filter_groups)
    dynamic_sampling: bool = field(
        default=False,
        metadata=_help(
            "Keep only groups with reward variance, generating extra rounds for more prompts until the batch is full."
        ),
    )
    dynamic_sampling_max_rounds: int = field(
        default=3, metadata=_help("Generation rounds per batch at most, the first included (verl max_num_gen_batches).")
    )
    dynamic_sampling_on_exhausted: str = field(
        default="fill",
        metadata=_help("When the rounds run out: 'fill' with zero-std groups (a replay buffer swaps them), 'raise'."),
    )
    # Prompt skipping (GRESO, arXiv:2506.02177; not in TRL): replayrl/grpo/prompt_skipping.py
    prompt_skipping: bool = field(
        default=False,
        metadata=_help(
            "Before generating, skip (with a probability growing with the streak) prompts whose recent groups all had "
            "zero reward variance, and generate other prompts of the training set in their place (GRESO)."
        ),
    )
    prompt_skipping_explore: float = field(
        default=0.5,
        metadata=_help("GRESO's p: a prompt with a streak of z zero-std groups is generated w.p. max(p**z, 0.01)."),
    )
    prompt_skipping_target_zero_std: float | None = field(
        default=0.25,
        metadata=_help("p moves by 0.01 per batch toward this share of zero-std groups (GRESO); None: p fixed."),
    )
    on_unscored_batch: str = field(
        default="warn",
        metadata=_help(
            "A generation batch whose every completion no reward function scored (all returned None): 'warn' and "
            "train on with zero advantages (TRL), or 'raise' a ValueError (reward functions that match no sample)."
        ),
    )
    # Asynchronous generation (docs/async.md); the names and defaults of TRL's AsyncGRPOConfig
    async_generation: bool = field(
        default=False, metadata=_help("Generate ahead in a worker process while training (docs/async.md).")
    )
    max_staleness: int = field(
        default=4,
        metadata=_help("With async_generation: rows sampled more than this many optimizer steps ago are dropped."),
    )
    weight_sync_steps: int = field(
        default=1, metadata=_help("With async_generation: optimizer steps between weight syncs to the worker.")
    )
    max_inflight_tasks: int = field(
        default=-1,
        metadata=_help(
            "With async_generation: rows generated ahead of the trainer, rounded down to whole generation batches "
            "(at least one); -1: one generation batch."
        ),
    )
    queue_maxsize: int = field(
        default=1024,
        metadata=_help("With async_generation: rows that may wait for the trainer; must hold one generation batch."),
    )
    # Logging
    log_completions: bool = field(default=False, metadata=_help("Print a table of completions at each log step."))
    num_completions_to_print: int | None = field(
        default=None, metadata=_help("Rows of that table; None (TRL): all the completions of the logging step.")
    )

    def __post_init__(self):
        super().__post_init__()
        self.scale_rewards = _normalise_scale_rewards(self.scale_rewards)
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        if isinstance(self.model_init_kwargs, str):
            import json

            self.model_init_kwargs = json.loads(self.model_init_kwargs)
        self._derive_generation_batch()
        self._validate()

    def _derive_generation_batch(self) -> None:
        """Fill in whichever of generation_batch_size / steps_per_generation is missing, as TRL does."""
        per_step = self.per_device_train_batch_size * self.world_size
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ValueError(
                "Set generation_batch_size or steps_per_generation, not both "
                f"(got {self.generation_batch_size} and {self.steps_per_generation})."
            )
        if self.generation_batch_size is None:
            self.steps_per_generation = self.steps_per_generation or self.gradient_accumulation_steps
            self.generation_batch_size = per_step * self.steps_per_generation
        else:
            if self.generation_batch_size % per_step != 0:
                raise ValueError(
                    f"generation_batch_size ({self.generation_batch_size}) must be divisible by "
                    f"per_device_train_batch_size * num_processes ({per_step}); use a multiple of {per_step}."
                )
            self.steps_per_generation = self.generation_batch_size // per_step

    def _validate(self) -> None:
        _importance_sampling_bounds(self)
        g = self.num_generations
        if g is None or g < 2:
            raise ValueError(
                f"num_generations must be >= 2 (got {g}): GRPO compares completions within a group, "
                "and a group of one has no advantage. Use num_generations=2 or more."
            )
        local = self.per_device_train_batch_size * self.steps_per_generation
        if local % g != 0:
            raise ValueError(
                f"Each process generates per_device_train_batch_size * steps_per_generation = {local} completions, "
                f"which is not divisible by num_generations={g}. Groups must not straddle processes: pick "
                f"per_device_train_batch_size (or steps_per_generation) so the product is a multiple of {g}, "
                f"e.g. per_device_train_batch_size={g}."
            )
        grpo_loss(self.loss_type)  # ValueError naming the registry's loss types
        checks = [
            (self.num_iterations >= 1, f"num_iterations must be >= 1 (got {self.num_iterations})."),
            (self.beta >= 0, f"beta must be >= 0 (got {self.beta}); use 0 to disable the KL term."),
            (self.epsilon > 0, f"epsilon must be > 0 (got {self.epsilon})."),
            (self.epsilon_high > 0, f"epsilon_high must be > 0 (got {self.epsilon_high}); None means = epsilon."),
            (
                self.max_prompt_length is None or self.max_prompt_length >= 1,
                f"max_prompt_length must be >= 1 or None for no limit (got {self.max_prompt_length}).",
            ),
            (self.temperature > 0, f"temperature must be > 0 (got {self.temperature})."),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1] (got {self.top_p})."),
            (self.max_completion_length and self.max_completion_length > 0, "max_completion_length must be >= 1."),
            (0 <= self.ref_model_mixup_alpha <= 1, "ref_model_mixup_alpha must be in [0, 1]."),
            (
                self.dynamic_sampling_max_rounds >= 1,
                f"dynamic_sampling_max_rounds must be >= 1 (got {self.dynamic_sampling_max_rounds}).",
            ),
            (
                self.dynamic_sampling_on_exhausted in ("fill", "raise"),
                "dynamic_sampling_on_exhausted must be 'fill' or 'raise' "
                f"(got {self.dynamic_sampling_on_exhausted!r}).",
            ),
            (
                self.on_unscored_batch in ("warn", "raise"),
                f"on_unscored_batch must be 'warn' or 'raise' (got {self.on_unscored_batch!r}).",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        from replayrl.grpo.prompt_skipping import validate_config

        validate_config(self)
        _warn_sequence_level_token_sum(self)
        validate_parity(self)
        if self.async_generation:
            from replayrl.grpo.async_rollouts import validate_async_config

            validate_async_config(self)
        if self.use_vllm:
            _validate_vllm(self)


def _warn_sequence_level_token_sum(args: GRPOConfig) -> None:
    """TRL's warning: sequence-level ratios with a loss that sums token terms weight sequences by their length."""
    if args.importance_sampling_level == "sequence" and args.loss_type in LENGTH_WEIGHTED_LOSSES:
        logger.warning(
            f"When using `importance_sampling_level='sequence'`, the `'{args.loss_type}'` loss sums per-token "
            "contributions, which effectively weights each sequence by its completion length instead of "
            "optimizing the per-sequence objective. To reproduce the GSPO paper's setup, set `loss_type='grpo'`."
        )


def _importance_sampling_bounds(args: GRPOConfig) -> None:
    """TRL's deprecated `vllm_importance_sampling_cap` sets C_max; the bounds must make an interval."""
    if args.vllm_importance_sampling_cap is not None:
        args.vllm_importance_sampling_clip_max = args.vllm_importance_sampling_cap
    high, low = args.vllm_importance_sampling_clip_max, args.vllm_importance_sampling_clip_min
    if high is not None and high <= 0:
        raise ValueError(f"vllm_importance_sampling_clip_max must be > 0 or None (got {high}).")
    if low is not None and (low < 0 or (high is not None and low >= high)):
        raise ValueError(
            f"vllm_importance_sampling_clip_min must be >= 0 and below clip_max (got {low}, clip_max {high})."
        )


def _validate_vllm(args: GRPOConfig) -> None:
    """GRPO's importance-sampling mode, then the options every vLLM trainer shares (and vLLM being installed)."""
    from replayrl.algos.mismatch import IS_MODES
    from replayrl.generation import check_vllm_config

    if args.vllm_importance_sampling_mode not in IS_MODES:
        raise ValueError(
            f"vllm_importance_sampling_mode must be one of {IS_MODES} (got {args.vllm_importance_sampling_mode!r})."
        )
    check_vllm_config(args)


def _normalise_scale_rewards(value: str | bool) -> str:
    """True/False (TRL's old boolean) map to 'group'/'none'; strings are checked."""
    if isinstance(value, bool):
        return "group" if value else "none"
    lowered = str(value).lower()
    aliases = {"true": "group", "false": "none"}
    lowered = aliases.get(lowered, lowered)
    if lowered not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS} or a bool (got {value!r}).")
    return lowered
