"""`RewardConfig`: TRL's reward-modelling parameters on top of `transformers.TrainingArguments`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replayrl.training_args import TrainingArguments


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
    remove_unused_columns: bool | None = field(
        default=False, metadata=_help("Kept False: the trainer tokenises the preference columns itself.")
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
    dataset_num_proc: int | None = field(default=None, metadata=_help("Processes for tokenising the dataset."))

    def __post_init__(self):
        super().__post_init__()
        if self.max_length is not None and self.max_length <= 0:
            raise ValueError(f"max_length must be > 0 or None (got {self.max_length}).")
        if self.center_rewards_coefficient is not None and self.center_rewards_coefficient < 0:
            raise ValueError(f"center_rewards_coefficient must be >= 0 (got {self.center_rewards_coefficient}).")
