"""`DPOConfig`: TRL's DPO parameters on top of `transformers.TrainingArguments`, validated once.

Names and defaults follow current TRL's `DPOConfig`, plus TRL v0.7.1's names that moved from the
trainer's signature into the config: `beta`, `max_length`, `max_prompt_length`, `label_pad_token_id`,
`padding_value`, `truncation_mode`, `disable_dropout`, `reference_free`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from replayrl.algos.preference import check_f_divergence, check_loss_types
from replayrl.training_args import (
    TrainingArguments,
    check_pad_to_multiple_of,
    resolve_pad_to_multiple_of,
    warn_pad_token_deprecated,
)


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class DPOConfig(TrainingArguments):
    """Configuration for [`DPOTrainer`]; the rest are `transformers.TrainingArguments`. Every field is also a
    `replayrl dpo --<field>` flag."""

    learning_rate: float = field(default=1e-6, metadata=_help("AdamW learning rate (TRL's DPO default 1e-6)."))
    logging_steps: float = field(default=10, metadata=_help("Log every N optimizer steps (TRL's default 10)."))
    trust_remote_code: bool = field(
        default=False,
        metadata=_help("Run the custom code a model, reference or tokenizer given by name ships with."),
    )
    model_init_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata=_help("Keyword arguments for `from_pretrained` when `model` is a name or path.")
    )
    ref_model_init_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata=_help("Keyword arguments for `from_pretrained` when `ref_model` is a name or path.")
    )
    router_aux_loss_coef: float | None = field(
        default=None,
        metadata=_help(
            "Weight of the mixture-of-experts router load-balancing loss added to the training loss (TRL's). None: "
            "the model config's `router_aux_loss_coef`; 0.0 turns it off; non-zero with a dense model raises."
        ),
    )
    # Data
    remove_unused_columns: bool | None = field(
        default=True,
        metadata=_help(
            "Drop the dataset columns the trainer does not read (after tokenisation: the token ids and precomputed "
            "reference log-probs are kept), as TRL. False keeps every column for a custom data_collator."
        ),
    )
    pad_token: str | None = field(
        default=None,
        metadata=_help("Deprecated (TRL 1.16): the padding token (None: the tokenizer's, else EOS)."),
    )
    pad_to_multiple_of: int | str | None = field(
        default="auto",
        metadata=_help("Pad each batch's width to a multiple of this; 'auto' (TRL): 128 on Neuron, else no padding."),
    )
    max_prompt_length: int | None = field(
        default=512, metadata=_help("Prompt tokens kept (the last ones); None: no limit.")
    )
    max_completion_length: int | None = field(
        default=None, metadata=_help("Completion tokens kept (the first ones, EOS included); None: no limit.")
    )
    max_length: int | None = field(
        default=1024, metadata=_help("Prompt + completion tokens kept, cut as `truncation_mode` says; None: no limit.")
    )
    truncation_mode: str = field(
        default="keep_start",
        metadata=_help("keep_start: drop the end of sequences longer than max_length; keep_end: drop the start."),
    )
    padding_value: int | None = field(default=None, metadata=_help("Pad id (None: the tokenizer's pad token)."))
    label_pad_token_id: int = field(default=-100, metadata=_help("Label of prompt and padding positions."))
    padding_free: bool = field(
        default=False,
        metadata=_help(
            "Pack the batch's 2B sequences into one row without padding (block-diagonal attention; position ids "
            "under FlashAttention). Same loss, fewer wasted tokens when lengths vary."
        ),
    )
    prefix_sharing: bool = field(
        default=True,
        metadata=_help(
            "Score each pair as one row, prefix | chosen rest | rejected rest, the common prefix (the prompt) "
            "encoded once (arXiv:2410.20305): the same log-probs from fewer tokens. Two rows per pair instead under "
            "FlashAttention/flex attention, sliding-window attention shorter than the row, or padding_free."
        ),
    )
    dataset_num_proc: int | None = field(default=None, metadata=_help("Processes for tokenising the dataset."))
    # Loss
    beta: float = field(default=0.1, metadata=_help("Strength of the implicit KL to the reference (DPO's beta)."))
    loss_type: list[str] | str = field(
        default_factory=lambda: ["sigmoid"],
        metadata=_help(
            "One or more of sigmoid, sigmoid_norm, hinge, ipo, robust, exo_pair, nca_pair, bco_pair, sppo_hard, aot, "
            "aot_pair (aot_unpaired), apo_zero, apo_down, discopop, sft; several are summed with loss_weights "
            "(docs/dpo.md)."
        ),
    )
    loss_weights: list[float] | None = field(
        default=None, metadata=_help("One weight per loss_type entry (None: all 1.0).")
    )
    label_smoothing: float = field(
        default=0.0, metadata=_help("Probability that a label is flipped (cDPO / robust / exo_pair), in [0, 0.5).")
    )
    f_divergence_type: str = field(
        default="reverse_kl", metadata=_help("f-DPO divergence: reverse_kl, js_divergence or alpha_divergence.")
    )
    f_alpha_divergence_coef: float = field(
        default=0.5,
        metadata=_help(
            "alpha of alpha_divergence, f'(u) = (u^(alpha-1) - 1) / (alpha - 1) (1: reverse_kl, 0: forward_kl)."
        ),
    )
    ld_alpha: float | None = field(
        default=None,
        metadata=_help(
            "LD-DPO (arXiv:2409.06411): weight of the completion tokens past the pair's shared length (min of the "
            "two completion lengths) in the sequence log-probs, in [0, 1]; None: no weighting (standard DPO)."
        ),
    )
    discopop_tau: float = field(default=0.05, metadata=_help("Temperature of the discopop loss."))
    rpo_alpha: float | None = field(
        default=None, metadata=_help("RPO (arXiv:2404.19733): add rpo_alpha * NLL of the chosen completion.")
    )
    use_weighting: bool = field(default=False, metadata=_help("WPO (arXiv:2406.11827): weight pairs by likelihood."))
    reference_free: bool = field(
        default=False, metadata=_help("Ignore the reference: its log-probs are taken as 0 (no reference model).")
    )
    # Reference model
    precompute_ref_log_probs: bool = field(
        default=False,
        metadata=_help("Compute reference log-probs once before training and keep no reference model in memory."),
    )
    precompute_ref_batch_size: int | None = field(
        default=None, metadata=_help("Batch size of the precomputation (None: per_device_eval_batch_size).")
    )
    sync_ref_model: bool = field(default=False, metadata=_help("TR-DPO: periodically mix the policy into the ref."))
    ref_model_mixup_alpha: float = field(default=0.6, metadata=_help("TR-DPO alpha: ref = a*policy + (1-a)*ref."))
    ref_model_sync_steps: int = field(default=512, metadata=_help("TR-DPO tau: sync every N optimizer steps."))
    disable_dropout: bool = field(default=True, metadata=_help("Turn dropout off in the model and the reference."))
    activation_offloading: bool = field(
        default=False,
        metadata=_help("Keep the activations saved for backward in CPU memory during training (save_on_cpu)."),
    )

    def __post_init__(self):
        if isinstance(self.loss_type, str):
            self.loss_type = [t.strip() for t in self.loss_type.split(",")]
        warn_pad_token_deprecated(self.pad_token)
        self.pad_to_multiple_of = resolve_pad_to_multiple_of(self.pad_to_multiple_of)
        super().__post_init__()
        check_pad_to_multiple_of(self.pad_to_multiple_of)
        check_loss_types(self.loss_type, self.loss_weights)
        check_f_divergence(self.f_divergence_type, self.loss_type)
        checks = [
            (self.beta > 0, f"beta must be > 0 (got {self.beta})."),
            (0 <= self.label_smoothing < 0.5, f"label_smoothing must be in [0, 0.5) (got {self.label_smoothing})."),
            (
                self.truncation_mode in ("keep_start", "keep_end"),
                f"truncation_mode must be 'keep_start' or 'keep_end' (got {self.truncation_mode!r}).",
            ),
            (0 <= self.ref_model_mixup_alpha <= 1, "ref_model_mixup_alpha must be in [0, 1]."),
            (
                self.ld_alpha is None or 0 <= self.ld_alpha <= 1,
                f"ld_alpha must be in [0, 1] (1: no weighting, 0: tokens past the shared length ignored) or None "
                f"(got {self.ld_alpha}).",
            ),
            (self.max_length is None or self.max_length > 0, f"max_length must be > 0 (got {self.max_length})."),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if self.truncation_mode == "keep_end":  # TRL 1.16's deprecation, in its words
            warnings.warn(
                "The `'keep_end'` truncation mode is deprecated and will be removed in v2.0.0. "
                "Use `truncation_mode='keep_start'` (the default) instead.",
                FutureWarning,
                stacklevel=3,
            )
        if self.sync_ref_model and (self.precompute_ref_log_probs or self.reference_free):
            raise ValueError(
                "sync_ref_model=True updates the reference during training, which contradicts "
                "precompute_ref_log_probs=True / reference_free=True: turn one of them off."
            )
