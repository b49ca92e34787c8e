"""Tokenisation for supervised fine-tuning: text, prompt-completion and conversational rows -> token ids + labels.

`tokenize_row` gives `input_ids` plus, where they apply, `completion_mask` (1 on completion tokens of
prompt-completion rows) and `assistant_masks` (1 on tokens the chat template marks with `{% generation %}`);
`prepare_sft_dataset` then bakes them into `labels` (-100 where no loss), as TRL 1.16's preparation does, so a
prepared row is {"input_ids", "labels"} (+ "seq_lengths" when packed).

- Standard (non-conversational) rows get the EOS id appended exactly once: not when the text already ends
  with it, and independently of the pad token (pad == eos never hides the real EOS: labels come from the
  row's length, not from comparing ids with the pad id).
- Conversational rows go through the tokenizer's chat template, which writes its own end-of-turn tokens;
  no EOS is added (as TRL). A row's own `chat_template_kwargs` and `tools` columns are passed to the template
  for that row (as TRL 1.16).
- `truncate_row` keeps the first (`keep_start`) or the last (`keep_end`) `max_length` tokens.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Literal

from replayrl.data.formats import DatasetFormat
from replayrl.data.streaming import column_names, drop_rows, first_row, map_options

logger = logging.getLogger(__name__)
GENERATION_MARK = re.compile(r"\{%-?\s*generation\s*-?%\}")
IGNORE_INDEX = -100  # a label that takes no loss
MASK_COLUMNS = ("completion_mask", "assistant_masks")
# Per-token columns a pre-tokenized row may carry: a `labels` column (-100 = no loss) is taken as is, as TRL 1.16.
TOKEN_COLUMNS = ("input_ids", "labels", *MASK_COLUMNS)


@dataclass(frozen=True)
class SFTTokenizeSettings:
    """What tokenisation needs from `SFTConfig` (a small picklable object for `dataset.map(num_proc=...)`)."""

    eos_token_id: int
    assistant_only_loss: bool = False
    max_length: int | None = 1024
    truncation_mode: Literal["keep_start", "keep_end"] = "keep_start"


def check_chat_template(tokenizer, fmt: DatasetFormat, assistant_only_loss: bool) -> None:
    """Conversational data needs a chat template; assistant-only loss needs its `{% generation %}` marks."""
    if not fmt.conversational:
        return
    template = tokenizer.chat_template
    if not template:
        raise ValueError(
            f"The dataset is {fmt.describe()} but the tokenizer has no chat template: set "
            "`chat_template_path` (a .jinja file) or `tokenizer.chat_template`."
        )
    if assistant_only_loss and not GENERATION_MARK.search(str(template)):
        raise ValueError(
            "assistant_only_loss=True but the chat template has no {% generation %} ... {% endgeneration %} "
            "marks around the assistant's text, so no token would be trained on. Use a template with "
            "generation marks (chat_template_path) or set assistant_only_loss=False."
        )


def check_no_transform(dataset) -> None:
    """As TRL 1.16's SFT: a dataset with a `Dataset.with_transform()` / `set_transform()` transform (format type
    "custom") cannot be prepared, since `map` reads through the transform and would bake a random or stateful
    augmentation into the tokenized columns once. Raised in TRL's words."""
    dataset_format = getattr(dataset, "format", None)  # datasets.Dataset only; an IterableDataset has none
    if isinstance(dataset_format, dict) and dataset_format.get("type") == "custom":
        raise ValueError(
            "SFTTrainer cannot prepare a dataset that uses `Dataset.with_transform()`. The preparation pipeline "
            "calls `Dataset.map()`, which reads through the transform and can bake a random or stateful transform "
            "into the tokenized columns. Pass `dataset_kwargs={'skip_prepare_dataset': True}` and make the "
            "transform return trainer-ready examples, including tokenized fields, or materialize deterministic "
            "transforms with `Dataset.map()` before constructing the trainer."
        )


def resolve_eos_token_id(tokenizer, eos_token: str | None) -> int:
    """The id of `eos_token` (default: the tokenizer's EOS); ValueError when it is not one token."""
    token = eos_token if eos_token is not None else tokenizer.eos_token
    if token is None:
        raise ValueError("The tokenizer has no eos_token: set `eos_token` in the config to the end-of-text token.")
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or (token_id == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise ValueError(f"eos_token={token!r} is not a token of the tokenizer's vocabulary; pass an existing token.")
    return token_id


def _with_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids if ids and ids[-1] == eos_id else [*ids, eos_id]


def _prefix_length(prompt_ids: list[int], full_ids: list[int]) -> int:
    if full_ids[: len(prompt_ids)] != prompt_ids:
        logger.warning(
            "Tokenising prompt + completion changed the prompt's tokens; the completion mask is approximate."
        )
    return len(prompt_ids)


def row_chat_template_kwargs(example: dict) -> dict:
    """The chat-template arguments a conversational row carries, as TRL 1.16 reads them: its `tools` column (a
    list of schemas, or JSON text of one) and its `chat_template_kwargs` column (a dict, e.g. {"enable_thinking":
    False}), passed to `apply_chat_template` for that row only."""
    kwargs = {}
    tools = example.get("tools")
    if tools is not None:
        kwargs["tools"] = json.loads(tools) if isinstance(tools, str) else tools
    return {**kwargs, **(example.get("chat_template_kwargs") or {})}


def _chat(tokenizer, messages: list, assistant_mask: bool, **kwargs) -> dict:
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=assistant_mask, **kwargs
    )
    row = {"input_ids": list(out["input_ids"])}
    if assistant_mask:
        row["assistant_masks"] = list(out["assistant_masks"])
    return row


def tokenize_row(example: dict, tokenizer, fmt: DatasetFormat, settings: SFTTokenizeSettings) -> dict:
    """One row -> {"input_ids", optional "completion_mask", optional "assistant_masks"} (untruncated)."""
    if fmt.kind == "language_modeling":
        value = example[fmt.text_column]
        if fmt.conversational:
            return _chat(tokenizer, value, settings.assistant_only_loss, **row_chat_template_kwargs(example))
        return {"input_ids": _with_eos(tokenizer(value).input_ids, settings.eos_token_id)}
    prompt, completion = example["prompt"], example["completion"]
    if fmt.conversational:
        kwargs = row_chat_template_kwargs(example)
        prompt_ids = tokenizer.apply_chat_template(
            prompt, tokenize=True, return_dict=True, add_generation_prompt=True, **kwargs
        )["input_ids"]
        row = _chat(tokenizer, [*prompt, *completion], settings.assistant_only_loss, **kwargs)
    else:
        prompt_ids = tokenizer(prompt).input_ids
        row = {"input_ids": _with_eos(tokenizer(prompt + completion).input_ids, settings.eos_token_id)}
    n_prompt = _prefix_length(list(prompt_ids), row["input_ids"])
    row["completion_mask"] = [0] * n_prompt + [1] * (len(row["input_ids"]) - n_prompt)
    return row


def truncate_row(row: dict, max_length: int | None, mode: str) -> tuple[dict, bool]:
    """(row cut to `max_length` tokens, whether it was cut); every per-token column is cut the same way."""
    n = len(row["input_ids"])
    if max_length is None or n <= max_length:
        return row, False
    keep = slice(0, max_length) if mode == "keep_start" else slice(n - max_length, n)
    return {k: (v[keep] if k in TOKEN_COLUMNS else v) for k, v in row.items()}, True


def trained_mask(row: dict, completion_only_loss: bool, assistant_only_loss: bool) -> list[int]:
    """1 where a token's label reaches the loss (before the causal shift drops position 0). A row's own `labels`
    decide alone (as TRL 1.16: a given labels column is left as is, the masks are not applied on top); else
    `completion_mask` when `completion_only_loss`, and `assistant_masks` whenever the row has them (as TRL 1.16;
    `assistant_only_loss` requires them)."""
    if row.get("labels") is not None:
        return [int(label != IGNORE_INDEX) for label in row["labels"]]
    mask = [1] * len(row["input_ids"])
    if completion_only_loss and row.get("completion_mask") is not None:
        mask = [m * c for m, c in zip(mask, row["completion_mask"])]
    if assistant_only_loss or row.get("assistant_masks") is not None:
        mask = [m * a for m, a in zip(mask, row["assistant_masks"])]
    return mask


def with_labels(row: dict, completion_only_loss: bool, assistant_only_loss: bool) -> dict:
    """{"input_ids", "labels"}: the masks baked into `labels` (-100 where no loss), as TRL 1.16's preparation;
    a row's own `labels` are kept as they are."""
    mask = trained_mask(row, completion_only_loss, assistant_only_loss)
    labels = row.get("labels")
    if labels is None:
        labels = [t if m else IGNORE_INDEX for t, m in zip(row["input_ids"], mask)]
    return {"input_ids": row["input_ids"], "labels": labels}


def apply_formatting_func(dataset, formatting_func, num_proc: int | None, text_field: str = "text"):
    """`formatting_func(example) -> str` (current TRL) or TRL v0.7.1's `formatting_func(batch) -> list[str]`.

    A function that returns a list for one example is taken as the batched (TRL v0.7.1) kind and called on
    batches instead. The result is a dataset with one column, `text_field`.
    """
    first = formatting_func(first_row(dataset))
    batched = isinstance(first, list)
    if not batched and not isinstance(first, str):
        raise ValueError(f"formatting_func must return a str (or, batched, a list of str); got {type(first).__name__}")

    def run(batch_or_row):
        return {text_field: formatting_func(batch_or_row)}

    options = map_options(dataset, num_proc)
    return dataset.map(run, batched=batched, remove_columns=column_names(dataset), **options)


def _tokenize_one(example: dict, index: int, tokenizer, fmt, settings, completion_only_loss: bool, truncate: bool):
    if fmt.kind == "tokenized":
        row = {k: list(example[k]) for k in TOKEN_COLUMNS if example.get(k) is not None}
    else:
        row = tokenize_row(example, tokenizer, fmt, settings)
    cut = False
    if truncate:
        row, cut = truncate_row(row, settings.max_length, settings.truncation_mode)
    row = with_labels(row, completion_only_loss, settings.assistant_only_loss)
    if not cut and not any(label != IGNORE_INDEX for label in row["labels"][1:]):
        raise ValueError(
            f"Row {index} of the dataset has no token to train on (it was not truncated): with "
            f"completion_only_loss={completion_only_loss} and assistant_only_loss={settings.assistant_only_loss} "
            "every label is masked (or its own `labels` are all -100). Check that the row has a non-empty "
            "completion / assistant turn, or turn the mask option off."
        )
    return row


def _has_a_trained_label(row: dict) -> bool:
    return any(label != IGNORE_INDEX for label in row["labels"])


def drop_untrained_rows(dataset):
    """The rows that keep a trained label after truncation, as TRL 1.16 (e.g. a prompt alone filling
    `max_length` under `keep_start`): the others add no loss. A warning with the count (a streaming dataset is
    filtered lazily, uncounted); a ValueError when no row is left."""
    return drop_rows(
        dataset,
        _has_a_trained_label,
        "Dropping fully masked examples",
        "Truncation to max_length left no row with a token to train on (each prompt fills max_length?): raise "
        "max_length, or set truncation_mode='keep_end'.",
        "Dropped %d of %d rows that truncation to max_length left with no token to train on.",
    )


def prepare_sft_dataset(
    dataset,
    tokenizer,
    fmt: DatasetFormat,
    settings: SFTTokenizeSettings,
    completion_only_loss: bool,
    packing: bool = False,
    packing_strategy: str = "bfd",
    num_proc: int | None = None,
):
    """Tokenise (unless pre-tokenised), truncate to `settings.max_length` and optionally pack a dataset.

    Returns a `datasets.Dataset` with `input_ids`, `labels` (the masks baked in: -100 where no loss, as TRL 1.16)
    and, when packed, `seq_lengths`. Unpacked rows that truncation left with no trained label are dropped.
    Truncation happens per document before packing, except for the "bfd_split" and "wrapped" strategies, which
    split documents instead.
    """
    from datasets import Dataset

    from replayrl.data.packing import pack_columns, pack_dataset_bfd

    truncate = not (packing and packing_strategy in ("bfd_split", "wrapped"))
    tokenized = dataset.map(
        _tokenize_one,
        with_indices=True,
        fn_kwargs=dict(
            tokenizer=tokenizer,
            fmt=fmt,
            settings=settings,
            completion_only_loss=completion_only_loss,
            truncate=truncate,
        ),
        remove_columns=column_names(dataset),
        **map_options(dataset, num_proc, "Tokenizing"),
    )
    if not packing:
        return drop_untrained_rows(tokenized) if settings.max_length is not None else tokenized
    if settings.max_length is None:
        raise ValueError("packing=True needs max_length (the length of a packed row); set max_length.")
    if packing_strategy in ("bfd", "bfd_split"):
        return pack_dataset_bfd(tokenized, settings.max_length, split=packing_strategy == "bfd_split")
    columns = {name: tokenized[name] for name in tokenized.column_names}
    return Dataset.from_dict(pack_columns(columns, settings.max_length, packing_strategy))
