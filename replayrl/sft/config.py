"""`SFTConfig`: current TRL's supervised fine-tuning parameters on top of `transformers.TrainingArguments`.

Names and defaults follow current TRL (`max_length=1024`, `packing=False`, `packing_strategy="bfd"`,
`completion_only_loss=None`, `learning_rate=2e-5`, ...); TRL v0.7.1's `max_seq_length` still works as an alias of
`max_length`. Deviations from TRL are listed in `docs/sft.md`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

from replayrl.algos.sft import SFT_LOSS_TYPES
from replayrl.training_args import (
    TrainingArguments,
    check_pad_to_multiple_of,
    resolve_pad_to_multiple_of,
    warn_pad_token_deprecated,
)

PACKING_STRATEGIES = ("bfd", "bfd_split", "wrapped")
TRUNCATION_MODES = ("keep_start", "keep_end")


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class SFTConfig(TrainingArguments):
    r"""Configuration for [`SFTTrainer`]. Only the SFT-specific parameters are listed; the rest are
    `transformers.TrainingArguments`. Every field is also a `replayrl sft --<field>` flag.
    """

    # Model
    model_init_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata=_help("Keyword arguments for `from_pretrained` when `model` is a name or path.")
    )
    router_aux_loss_coef: float | None = field(
        default=None,
        metadata=_help(
            "Weight of the mixture-of-experts router load-balancing loss added to the training loss (TRL's). None: "
            "the model config's `router_aux_loss_coef`; 0.0 turns it off; non-zero with a dense model raises."
        ),
    )
    chat_template_path: str | None = field(
        default=None,
        metadata=_help("A chat template file (.jinja) or tokenizer folder whose template replaces the tokenizer's."),
    )
    trust_remote_code: bool = field(
        default=False,
        metadata=_help("Run the custom code a model or tokenizer given by name ships with (`from_pretrained`'s flag)."),
    )
    # Data
    dataset_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata=_help('Dataset preparation options; {"skip_prepare_dataset": true} uses the dataset as given.'),
    )
    dataset_text_field: str = field(default="text", metadata=_help("Column holding the text (language modeling)."))
    dataset_num_proc: int | None = field(default=None, metadata=_help("Processes for tokenising the dataset."))
    eos_token: str | None = field(
        default=None, metadata=_help("End-of-text token appended to standard rows (None: the tokenizer's EOS).")
    )
    pad_token: str | None = field(
        default=None,
        metadata=_help(
            "Deprecated (TRL 1.16): padding token (None: the tokenizer's, else EOS); set tokenizer.pad_token."
        ),
    )
    max_length: int | None = field(
        default=1024,
        metadata=_help("Maximum tokens per row (truncation; the row length when packing). None: no limit."),
    )
    max_seq_length: int | None = field(
        default=None, metadata=_help("Deprecated alias of max_length (TRL < 0.20 name); sets max_length.")
    )
    truncation_mode: Literal["keep_start", "keep_end"] = field(
        default="keep_start", metadata=_help("Keep the first (keep_start) or last (keep_end) max_length tokens.")
    )
    shuffle_dataset: bool = field(
        default=False,
        metadata=_help("Shuffle the prepared dataset (with `seed`; before and after packing), as TRL's SFTTrainer."),
    )
    packing: bool = field(default=False, metadata=_help("Pack several documents into each row of max_length."))
    packing_strategy: Literal["bfd", "bfd_split", "wrapped"] = field(
        default="bfd",
        metadata=_help(
            "bfd: best-fit-decreasing, documents kept whole (longer ones truncated); bfd_split: as bfd, but longer "
            "documents are cut into max_length pieces packed on their own; wrapped: end to end, cut every max_length."
        ),
    )
    padding_free: bool = field(
        default=False,
        metadata=_help("Flatten each batch into one row without padding; documents kept apart as in packing."),
    )
    pad_to_multiple_of: int | str | None = field(
        default="auto",
        metadata=_help("Pad each batch's width to a multiple of this; 'auto' (TRL): 128 on Neuron, else no padding."),
    )
    eval_packing: bool | None = field(default=None, metadata=_help("Pack the eval set (None: same as packing)."))
    # Training
    completion_only_loss: bool | None = field(
        default=None,
        metadata=_help("Train only on completion tokens of prompt-completion data (None: on for such data)."),
    )
    assistant_only_loss: bool = field(
        default=False,
        metadata=_help("Train only on the assistant's tokens (needs a chat template with generation marks)."),
    )
    loss_type: Literal["nll", "dft", "chunked_nll"] = field(
        default="nll",
        metadata=_help(
            "nll: negative log-likelihood; dft: Dynamic Fine-Tuning (arXiv 2508.05629); chunked_nll: TRL 1.16's "
            "deprecated alias of nll."
        ),
    )
    learning_rate: float = field(default=2e-5, metadata=_help("AdamW learning rate (SFT default 2e-5)."))
    logging_steps: float = field(default=10, metadata=_help("Log every N optimizer steps."))
    activation_offloading: bool = field(
        default=False,
        metadata=_help("Keep the activations saved for backward in CPU memory during training (save_on_cpu)."),
    )

    def __post_init__(self):
        if self.max_seq_length is not None:
            warnings.warn("`max_seq_length` is deprecated: use `max_length`.", FutureWarning, stacklevel=2)
            self.max_length = self.max_seq_length
        warn_pad_token_deprecated(self.pad_token)
        if self.packing_strategy == "bfd-requeue":  # TRL 1.16's deprecated name, renamed as TRL does
            warnings.warn(
                "The `bfd-requeue` packing strategy has been renamed to `bfd_split`: use packing_strategy='bfd_split'.",
                FutureWarning,
                stacklevel=2,
            )
            self.packing_strategy = "bfd_split"
        if self.loss_type == "chunked_nll":  # TRL 1.16's deprecated alias: nll never forms the full logits here
            warnings.warn(
                "`loss_type='chunked_nll'` is deprecated and will be removed in v2.0.0. Use `loss_type='nll'` (the "
                "default), which computes the loss the same way, without materializing the full logits.",
                FutureWarning,
                stacklevel=3,
            )
            self.loss_type = "nll"
        self.pad_to_multiple_of = resolve_pad_to_multiple_of(self.pad_to_multiple_of)
        super().__post_init__()
        import json

        for name in ("model_init_kwargs", "dataset_kwargs"):
            if isinstance(getattr(self, name), str):  # a JSON string from the command line
                setattr(self, name, json.loads(getattr(self, name)))
        self._validate()

    def _validate(self) -> None:
        choices = {
            "packing_strategy": (self.packing_strategy, PACKING_STRATEGIES),
            "truncation_mode": (self.truncation_mode, TRUNCATION_MODES),
            "loss_type": (self.loss_type, SFT_LOSS_TYPES),
        }
        for name, (value, allowed) in choices.items():
            if value not in allowed:
                raise ValueError(f"{name}={value!r}: expected one of {', '.join(allowed)}.")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"max_length={self.max_length}: must be >= 2 (or None for no limit).")
        if self.packing and self.max_length is None:
            raise ValueError("packing=True needs max_length (the length of a packed row); set max_length.")
        check_pad_to_multiple_of(self.pad_to_multiple_of)
