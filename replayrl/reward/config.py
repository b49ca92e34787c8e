"""`RewardConfig`: TRL's reward-modelling parameters on top of `transformers.TrainingArguments`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replayrl.training_args import (
    TrainingArguments,
    check_pad_to_multiple_of,
    resolve_pad_to_multiple_of,
    warn_pad_token_deprecated,
)


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class RewardConfig(TrainingArguments):
    """Configuration for [`RewardTrainer`]; the rest are `transformers.TrainingArguments`. Every field is also a
    `replayrl reward --<field>` flag."""

    learning_rate: float = field(default=1e-4, metadata=_help("AdamW learning rate (TRL's reward default 1e-4)."))
    model_init_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata=_help("Keyword arguments for `from_pretrained` when `model` is a name or path.")
    )
    logging_steps: float = field(default=10, metadata=_help("Log every N optimizer steps (TRL's default 10)."))
    trust_remote_code: bool = field(
        default=False,
        metadata=_help("Run the custom code a model or tokenizer given by name ships with (`from_pretrained`'s flag)."),
    )
    chat_template_path: str | None = field(
        default=None,
        metadata=_help("A chat template file (.jinja) or tokenizer folder whose template replaces the tokenizer's."),
    )
    eos_token: str | None = field(
        default=None,
        metadata=_help("The tokenizer's end-of-text token (and the model config's eos_token_id); None: unchanged."),
    )
    pad_token: str | None = field(
        default=None,
        metadata=_help("Deprecated (TRL 1.16): the padding token, also the model config's pad_token_id."),
    )
    remove_unused_columns: bool | None = field(
        default=True,
        metadata=_help(
            "Drop the dataset columns the trainer does not read (after tokenisation: the token ids, masks and "
            "margin are kept), as TRL. False keeps every column for a custom data_collator."
        ),
    )
    pad_to_multiple_of: int | str | None = field(
        default="auto",
        metadata=_help("Pad each batch's width to a multiple of this; 'auto' (TRL): 128 on Neuron, else no padding."),
    )
    max_length: int | None = field(
        default=1024,
        metadata=_help("Pairs whose chosen or rejected sequence is longer (in tokens) are dropped; None: no limit."),
    )
    center_rewards_coefficient: float | None = field(
        default=None,
        metadata=_help("Adds c * mean((r_c + r_r)^2) to centre rewards on 0 (arXiv:2312.09244; 0.01 recommended)."),
    )
    append_eos: bool = field(
        default=False,
        metadata=_help(
            "Append EOS to each text sequence (TRL does). Off: replayrl's GRPO scores prompt + completion without "
            "EOS, and the reward is read at the last token, so training must see the same ending."
        ),
    )
    prefix_sharing: bool = field(
        default=True,
        metadata=_help(
            "Score each pair as one row, common prefix | chosen rest | rejected rest, the prefix (the prompt) "
            "encoded once (arXiv:2410.20305): the same rewards from fewer tokens. Decoder models with a `score` "
            "head under sdpa/eager attention; two rows otherwise (FlashAttention, encoders, left-padded masks)."
        ),
    )
    disable_dropout: bool = field(default=True, metadata=_help("Turn dropout off in the model."))
    activation_offloading: bool = field(
        default=False,
        metadata=_help("Keep the activations saved for backward in CPU memory during training (save_on_cpu)."),
    )
    dataset_num_proc: int | None = field(default=None, metadata=_help("Processes for tokenising the dataset."))

    def __post_init__(self):
        warn_pad_token_deprecated(self.pad_token)
        self.pad_to_multiple_of = resolve_pad_to_multiple_of(self.pad_to_multiple_of)
        super().__post_init__()
        check_pad_to_multiple_of(self.pad_to_multiple_of)
        if self.max_length is not None and self.max_length <= 0:
            raise ValueError(f"max_length must be > 0 or None (got {self.max_length}).")
        if self.center_rewards_coefficient is not None and self.center_rewards_coefficient < 0:
            raise ValueError(f"center_rewards_coefficient must be >= 0 (got {self.center_rewards_coefficient}).")
