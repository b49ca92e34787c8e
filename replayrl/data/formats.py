"""Dataset formats shared by every trainer, detected from a dataset's columns and its first row.

| format            | columns                                  | standard value | conversational value     |
|-------------------|------------------------------------------|----------------|--------------------------|
| language_modeling | `text` (or `dataset_text_field`), or `messages` | str     | list of {role, content}  |
| prompt_only       | `prompt`                                 | str            | list of messages         |
| prompt_completion | `prompt`, `completion`                   | str            | lists of messages        |
| preference        | `chosen`, `rejected` (+ optional `prompt`: explicit, else implicit) | str | lists of messages |

Pre-tokenized data (an `input_ids` column) is its own format, `tokenized`. The names follow TRL's dataset-format
guide; which trainer takes which format is in `SFT_FORMATS` and the error messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from replayrl.data.prompts import is_conversational

FormatKind = Literal["language_modeling", "prompt_only", "prompt_completion", "preference", "tokenized"]
SFT_FORMATS = ("language_modeling", "prompt_completion", "tokenized")


@dataclass(frozen=True)
class DatasetFormat:
    """What a dataset holds. `text_column`: the column holding the text or the conversation (language
    modeling); `implicit_prompt`: preference data whose prompt is the shared start of chosen and rejected."""

    kind: FormatKind
    conversational: bool
    text_column: str | None = None
    implicit_prompt: bool = False

    def describe(self) -> str:
        style = "conversational" if self.conversational else "standard"
        return f"{style} {self.kind.replace('_', '-')}"


MESSAGE_COLUMNS = ("prompt", "completion", "chosen", "rejected", "messages", "conversations")


def is_conversational_from_value(example: dict) -> bool:
    """TRL 1.16's test for ShareGPT-style rows: a `conversations` list whose first message has `from` and `value`
    keys (ChatML's `role` / `content` under other names)."""
    messages = example.get("conversations")
    return (
        isinstance(messages, list)
        and bool(messages)
        and isinstance(messages[0], dict)
        and ("from" in messages[0] and "value" in messages[0])
    )


def maybe_convert_to_chatml(example: dict) -> dict:
    """TRL 1.16's conversion of a `from`/`value` row to ChatML: in every message list (`prompt`, `completion`,
    `chosen`, `rejected`, `messages`, `conversations`) `from` becomes `role` and `value` becomes `content`, and
    `conversations` is renamed `messages`. Role names are kept as they are (`human` stays `human`), as in TRL."""
    for key in MESSAGE_COLUMNS:
        if isinstance(example.get(key), list):
            for message in example[key]:
                if isinstance(message, dict):
                    if "from" in message:
                        message["role"] = message.pop("from")
                    if "value" in message:
                        message["content"] = message.pop("value")
    if "conversations" in example:
        example["messages"] = example.pop("conversations")
    return example


def convert_from_value_to_chatml(dataset, num_proc: int | None = None):
    """The dataset with ShareGPT (`conversations` of `from`/`value`) rows converted to ChatML `messages`, when its
    first row is such a row (as TRL 1.16 decides); otherwise (or when pre-tokenized) the dataset unchanged."""
    from replayrl.data.streaming import column_names, first_row, map_options

    if "input_ids" in column_names(dataset) or not is_conversational_from_value(first_row(dataset) or {}):
        return dataset
    return dataset.map(
        maybe_convert_to_chatml,
        remove_columns=["conversations"] if "conversations" in column_names(dataset) else None,
        **map_options(dataset, num_proc, "Converting to ChatML"),
    )


def detect_format(columns: list[str], example: dict | None, dataset_text_field: str = "text") -> DatasetFormat:
    """The format of a dataset from its column names and first row (`example`; None for an empty dataset).

    Raises ValueError naming the columns when they fit no format.
    """
    cols = set(columns)
    row = example or {}
    if "input_ids" in cols:
        return DatasetFormat("tokenized", conversational=False)
    if {"chosen", "rejected"} <= cols:
        return DatasetFormat("preference", is_conversational(row.get("chosen")), implicit_prompt="prompt" not in cols)
    if {"prompt", "completion"} <= cols:
        return DatasetFormat("prompt_completion", is_conversational(row.get("prompt")))
    if dataset_text_field in cols:
        return DatasetFormat("language_modeling", is_conversational(row.get(dataset_text_field)), dataset_text_field)
    if "messages" in cols:
        return DatasetFormat("language_modeling", True, "messages")
    if "prompt" in cols:
        return DatasetFormat("prompt_only", is_conversational(row.get("prompt")))
    raise ValueError(
        f"Cannot tell the dataset's format from its columns {sorted(cols)}. Expected one of: "
        f"'{dataset_text_field}' (language modeling; set dataset_text_field for another column name), 'messages' "
        "(conversational), 'prompt' + 'completion', 'prompt' alone (prompt-only), 'chosen' + 'rejected' "
        "(preference), or pre-tokenized 'input_ids'. Rename the columns or pass a formatting_func."
    )


def dataset_format(dataset, dataset_text_field: str = "text") -> DatasetFormat:
    """`detect_format` for a `datasets.Dataset` or `IterableDataset` (read up to its first example)."""
    from replayrl.data.streaming import column_names, first_row

    return detect_format(column_names(dataset), first_row(dataset), dataset_text_field)


def check_sft_format(fmt: DatasetFormat, assistant_only_loss: bool = False) -> None:
    """Raise a fix-it ValueError when SFT cannot train on `fmt`."""
    if fmt.kind == "preference":
        raise ValueError(
            f"This is a preference dataset ({fmt.describe()}: 'chosen'/'rejected' columns): use DPOTrainer or "
            "RewardTrainer, or keep only 'chosen' (as 'text'/'messages', or 'prompt' + 'completion') for SFT."
        )
    if fmt.kind == "prompt_only":
        raise ValueError(
            "This is a prompt-only dataset (a 'prompt' column, no 'completion'): SFT needs targets. Add a "
            "'completion' column, or train on it with an online trainer such as GRPOTrainer."
        )
    if assistant_only_loss and not fmt.conversational and fmt.kind != "tokenized":
        raise ValueError(
            f"assistant_only_loss=True needs conversational data ('messages' or message lists), got a "
            f"{fmt.describe()} dataset. Use completion_only_loss with prompt/completion columns instead."
        )
