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
