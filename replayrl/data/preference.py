"""Preference data for the DPO and reward trainers: validate, split the prompt off, tokenise, pad.

Accepted rows (TRL's formats), standard (strings) or conversational (lists of {"role", "content"} messages):
  - explicit prompt: `prompt`, `chosen`, `rejected`, the completions without the prompt;
  - implicit prompt: `chosen`, `rejected` only, each the whole text/conversation; the prompt is their common
    prefix (`extract_prompt`);
  - optional `margin` (float): the reward trainer subtracts it inside the Bradley-Terry loss;
  - pre-tokenized, in TRL 1.16's prepared layout: DPO `prompt_ids`, `chosen_ids`, `rejected_ids` (completions
    without the prompt); reward `chosen_ids`, `rejected_ids` (whole sequences). Older names are renamed to these
    (`rename_old_dpo_columns`, `rename_old_reward_columns`): DPO's TRL v0.7.1 `prompt_input_ids`/`chosen_input_ids`/
    `rejected_input_ids`; reward's `chosen_input_ids`/`rejected_input_ids` (TRL 1.16 deprecates them, with a
    FutureWarning) and TRL v0.7.1's `input_ids_chosen`/`input_ids_rejected` (+ `attention_mask_*`).
Conversational rows go through the tokenizer's chat template, with the row's own `chat_template_kwargs` and `tools`
columns when it has them (as TRL 1.16). DPO completions get EOS appended once; reward sequences only with
`append_eos=True` (see `tokenize_reward_row`). Tokenizing keeps the row's other columns, as TRL 1.16's prepared
datasets do (an implicit prompt is split off into `prompt`, `chosen`, `rejected` for DPO).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from replayrl.data.prompts import is_conversational
from replayrl.data.sft import row_chat_template_kwargs
from replayrl.data.streaming import column_names, is_streaming

logger = logging.getLogger(__name__)

TruncationMode = Literal["keep_start", "keep_end"]
DPO_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")  # TRL 1.16's prepared DPO columns
REWARD_COLUMNS = ("chosen_ids", "rejected_ids")  # TRL 1.16's prepared reward columns
OLD_DPO_COLUMNS = {  # TRL v0.7.1's
    "prompt_input_ids": "prompt_ids",
    "chosen_input_ids": "chosen_ids",
    "rejected_input_ids": "rejected_ids",
}
DEPRECATED_REWARD_COLUMNS = {"chosen_input_ids": "chosen_ids", "rejected_input_ids": "rejected_ids"}
V071_REWARD_COLUMNS = {"input_ids_chosen": "chosen_ids", "input_ids_rejected": "rejected_ids"}


def dataset_kind(columns: Sequence[str], name: str = "dataset", allow_pretokenized: bool = False) -> str:
    """'pretokenized' (TRL 1.16's reward `chosen_ids`/`rejected_ids`, with `allow_pretokenized`), 'tokenized'
    (TRL 1.16's DPO `prompt_ids`/`chosen_ids`/`rejected_ids`) or 'preference'; else a ValueError naming the columns
    found and the ones expected. Old column names are renamed before (`rename_old_*_columns`)."""
    columns = list(columns)
    if allow_pretokenized and set(REWARD_COLUMNS) <= set(columns):
        return "pretokenized"
    if not allow_pretokenized and set(DPO_COLUMNS) <= set(columns):
        return "tokenized"
    if "chosen" in columns and "rejected" in columns:
        return "preference"
    expected = "'chosen' and 'rejected' (optionally 'prompt' and 'margin')"
    if allow_pretokenized:
        expected += ", or the pre-tokenized 'chosen_ids'/'rejected_ids'"
    else:
        expected += ", or the pre-tokenized 'prompt_ids'/'chosen_ids'/'rejected_ids'"
    raise ValueError(
        f"{name} is not a preference dataset: it has columns {columns}, expected {expected}. Rename your columns, "
        "e.g. dataset.rename_column('better', 'chosen')."
    )


def rename_old_dpo_columns(dataset):
    """TRL v0.7.1's pre-tokenized DPO columns `prompt_input_ids`/`chosen_input_ids`/`rejected_input_ids` -> TRL
    1.16's `prompt_ids`/`chosen_ids`/`rejected_ids` (a dataset that already has TRL 1.16's is left as it is)."""
    columns = set(column_names(dataset))
    if set(OLD_DPO_COLUMNS) <= columns and not set(DPO_COLUMNS) & columns:
        return dataset.rename_columns(OLD_DPO_COLUMNS)
    return dataset


def _unmasked(ids: list[int], mask: list[int] | None) -> list[int]:
    return list(ids) if mask is None else [t for t, m in zip(ids, mask) if m]


def _from_v071_reward(row: dict) -> dict:
    """TRL v0.7.1's reward row -> TRL 1.16's: the tokens its attention masks keep, as `chosen_ids`/`rejected_ids`."""
    return {
        new: _unmasked(row[old], row.get(old.replace("input_ids", "attention_mask")))
        for old, new in V071_REWARD_COLUMNS.items()
    }


def rename_old_reward_columns(dataset, name: str):
    """Older pre-tokenized reward columns -> TRL 1.16's `chosen_ids`/`rejected_ids`: the deprecated
    `chosen_input_ids`/`rejected_input_ids` (with TRL 1.16's FutureWarning), and TRL v0.7.1's `input_ids_chosen`/
    `input_ids_rejected` with their `attention_mask_chosen`/`attention_mask_rejected` (masked-out tokens dropped; TRL
    1.16's collator builds the masks). A DPO dataset (`prompt_input_ids`) and TRL 1.16's own names are left alone."""
    columns = set(column_names(dataset))
    if set(REWARD_COLUMNS) & columns:
        return dataset
    if set(DEPRECATED_REWARD_COLUMNS) <= columns and "prompt_input_ids" not in columns:
        warnings.warn(
            f"{name}: the columns 'chosen_input_ids'/'rejected_input_ids' will not be supported in v1 of TRL's API "
            "(TRL 1.16 deprecates them): name them 'chosen_ids'/'rejected_ids'.",
            FutureWarning,
            stacklevel=4,
        )
        return dataset.rename_columns(DEPRECATED_REWARD_COLUMNS)
    if set(V071_REWARD_COLUMNS) <= columns:
        masks = [c for c in ("attention_mask_chosen", "attention_mask_rejected") if c in columns]
        return dataset.map(_from_v071_reward, remove_columns=[*V071_REWARD_COLUMNS, *masks])
    return dataset


def extract_prompt(example: dict) -> dict:
    """Split an implicit prompt off `chosen` and `rejected`: the prompt is their longest common prefix (whole
    messages for conversations; characters for text, leaving a shared trailing space to the completions).
    Rows that already have a `prompt` are returned unchanged."""
    if "prompt" in example and example["prompt"] is not None:
        return example
    chosen, rejected = example["chosen"], example["rejected"]
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if isinstance(chosen, str):
        while n > 0 and chosen[n - 1].isspace():
            n -= 1
    if n == 0 or n == len(chosen) or n == len(rejected):
        raise ValueError(
            "cannot extract an implicit prompt: chosen and rejected must share a non-empty prefix and differ "
            f"after it (chosen={chosen!r}, rejected={rejected!r}); give an explicit 'prompt' column instead."
        )
    return {**example, "prompt": chosen[:n], "chosen": chosen[n:], "rejected": rejected[n:]}


def _apply_template(tokenizer, prompt, completion, **template_kwargs) -> tuple[str, str]:
    """Prompt and completion as text; conversations through the chat template (with `template_kwargs`, the row's
    own), the completion being what the template adds after the prompt's generation prompt."""
    if not is_conversational(prompt) and not is_conversational(completion):
        return prompt, completion
    if not (is_conversational(prompt) and is_conversational(completion)):
        raise ValueError("prompt and completion must both be conversations (lists of messages) or both strings")
    prompt_text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, **template_kwargs)
    full = tokenizer.apply_chat_template(prompt + completion, tokenize=False, **template_kwargs)
    if not full.startswith(prompt_text):
        raise ValueError(
            "the chat template renders prompt + completion with a different prefix than the prompt alone, so the "
            "completion cannot be split off; use a template whose generation prompt is a prefix of the reply."
        )
    return prompt_text, full[len(prompt_text) :]


def _with_eos(ids: list[int], eos_id: int | None) -> list[int]:
    return ids + [eos_id] if eos_id is not None and (not ids or ids[-1] != eos_id) else ids


def tokenize_dpo_row(
    example: dict, tokenizer, max_prompt_length: int | None = None, max_completion_length: int | None = None
) -> dict:
    """TRL 1.16's DPO columns: prompt_ids (the last `max_prompt_length` tokens), chosen_ids / rejected_ids
    (completion tokens + EOS, the first `max_completion_length`), with `prompt`, `chosen`, `rejected` (an implicit
    prompt split off). No special tokens are added to the prompt (chat templates carry their own)."""
    example = extract_prompt(example)
    kwargs = row_chat_template_kwargs(example)
    prompt_text, chosen_text = _apply_template(tokenizer, example["prompt"], example["chosen"], **kwargs)
    _, rejected_text = _apply_template(tokenizer, example["prompt"], example["rejected"], **kwargs)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt_ids = encode(prompt_text)
    chosen_ids = _with_eos(encode(chosen_text), tokenizer.eos_token_id)
    rejected_ids = _with_eos(encode(rejected_text), tokenizer.eos_token_id)
    ids = {"prompt_ids": prompt_ids, "chosen_ids": chosen_ids, "rejected_ids": rejected_ids}
    texts = {key: example[key] for key in ("prompt", "chosen", "rejected")}
    return {**texts, **truncate_dpo_row(ids, max_prompt_length, max_completion_length)}


def truncate_dpo_row(
    example: dict, max_prompt_length: int | None = None, max_completion_length: int | None = None
) -> dict:
    """A tokenized DPO row's `prompt_ids` cut to its last `max_prompt_length` tokens and `chosen_ids` /
    `rejected_ids` to their first `max_completion_length` (None: as they are)."""
    prompt, chosen, rejected = (list(example[key]) for key in DPO_COLUMNS)
    if max_prompt_length is not None:
        prompt = prompt[-max_prompt_length:] if max_prompt_length > 0 else []
    if max_completion_length is not None:
        chosen, rejected = chosen[:max_completion_length], rejected[:max_completion_length]
    return {"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected}


def tokenize_reward_row(example: dict, tokenizer, append_eos: bool = False) -> dict:
    """TRL 1.16's reward columns `chosen_ids`, `rejected_ids`: whole sequences (prompt + completion, + EOS if
    `append_eos`), no masks (the collator builds them). `prompt` is optional: without it chosen/rejected are the
    whole texts or conversations. EOS is off by default because GRPO scores `prompt + completion` text decoded
    without special tokens: a model trained on sequences ending in EOS would be read at a different position
    there."""
    out, kwargs = {}, row_chat_template_kwargs(example)
    for side in ("chosen", "rejected"):
        prompt, completion = example.get("prompt"), example[side]
        if prompt is None:
            if is_conversational(completion):
                text = tokenizer.apply_chat_template(completion, tokenize=False, **kwargs)
            else:
                text = completion
        else:
            text = "".join(_apply_template(tokenizer, prompt, completion, **kwargs))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if append_eos:
            ids = _with_eos(ids, tokenizer.eos_token_id)
        out[f"{side}_ids"] = ids
    return out


def truncate_pair(
    prompt: list[int], completion: list[int], max_length: int | None, mode: TruncationMode
) -> tuple[list[int], list[int]]:
    """Cut prompt + completion to `max_length` tokens: keep_start drops the end (the completion first),
    keep_end drops the beginning (the prompt first)."""
    if max_length is None or len(prompt) + len(completion) <= max_length:
        return prompt, completion
    if mode == "keep_start":
        return prompt[:max_length], completion[: max(0, max_length - len(prompt))]
    if mode == "keep_end":
        drop = len(prompt) + len(completion) - max_length
        return prompt[drop:], completion[max(0, drop - len(prompt)) :]
    raise ValueError(f"truncation_mode must be 'keep_start' or 'keep_end' (got {mode!r})")


def drop_fully_truncated(dataset, name: str, max_length: int):
    """DPO rows (`prompt_ids`) -> the rows that keep a completion token under `truncation_mode="keep_start"`.
    As TRL 1.16: under `keep_start`, a pair whose prompt (after `max_prompt_length`) alone fills `max_length`
    would keep no completion token in the collator, so no learning signal: it is dropped (a streaming dataset:
    lazily, without the count). `keep_end` keeps the completions' ends, so nothing is dropped there."""

    def has_room(row):
        return len(row["prompt_ids"]) < max_length

    if is_streaming(dataset):
        return dataset.filter(has_room)
    n = len(dataset)
    dataset = dataset.filter(has_room, desc=f"Dropping fully truncated examples from {name}")
    if len(dataset) == 0 and n > 0:
        raise ValueError(
            f"every pair of {name} has a prompt of max_length={max_length} tokens or more, so truncation_mode="
            "'keep_start' would cut every completion away: raise max_length, lower max_prompt_length (the "
            "prompt keeps its last tokens), or set truncation_mode='keep_end'."
        )
    if len(dataset) < n:
        logger.warning(
            "%s: dropped %d of %d pairs whose prompt fills max_length=%d (truncation_mode='keep_start' would "
            "leave them no completion token)",
            name,
            n - len(dataset),
            n,
            max_length,
        )
    return dataset


def pad(rows: list[list], value, side: str = "right", dtype=torch.long, multiple: int | None = None) -> Tensor:
    """Lists of different lengths -> (N, max_len) tensor padded with `value` on `side`; with `multiple`, the width
    is rounded up to a multiple of it (TRL's `pad_to_multiple_of`)."""
    width = max((len(r) for r in rows), default=0)
    if multiple:
        width = -(-width // multiple) * multiple
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            if side == "right":
                out[i, : len(r)] = torch.tensor(r, dtype=dtype)
            else:
                out[i, width - len(r) :] = torch.tensor(r, dtype=dtype)
    return out


def per_side_dpo_batch(batch: dict, label_pad_token_id: int = -100) -> dict:
    """TRL 1.16's DPO batch (its `DataCollatorForPreference`: `input_ids`, `attention_mask`, `completion_mask`
    (2B, L), every chosen row then every rejected one) -> the per-side batch `DPODataCollator` builds:
    `{side}_input_ids`, `{side}_attention_mask`, `{side}_labels` (B, L) (the completion's tokens, else
    `label_pad_token_id`); other keys (`ref_chosen_logps`, ...) kept. A per-side batch is returned as it is."""
    if "chosen_input_ids" in batch or "completion_mask" not in batch:
        return batch
    ids, mask, completion = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    labels = ids.masked_fill(completion == 0, label_pad_token_id)
    n = ids.shape[0] // 2
    out = {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask", "completion_mask")}
    for side, rows in (("chosen", slice(0, n)), ("rejected", slice(n, 2 * n))):
        out[f"{side}_input_ids"], out[f"{side}_attention_mask"] = ids[rows], mask[rows]
        out[f"{side}_labels"] = labels[rows]
    return out


def per_side_reward_batch(batch: dict) -> dict:
    """TRL 1.16's reward batch (its `DataCollatorForPreference`: `input_ids`, `attention_mask` (2B, L), every chosen
    row then every rejected one) -> the per-side batch `RewardDataCollatorWithPadding` builds: `input_ids_{side}`,
    `attention_mask_{side}` (B, L); `margin` kept. A per-side batch is returned as it is."""
    if "input_ids_chosen" in batch or "input_ids" not in batch:
        return batch
    ids, mask, n = batch["input_ids"], batch["attention_mask"], batch["input_ids"].shape[0] // 2
    out = {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask")}
    for side, rows in (("chosen", slice(0, n)), ("rejected", slice(n, 2 * n))):
        out[f"input_ids_{side}"], out[f"attention_mask_{side}"] = ids[rows], mask[rows]
    return out


class DPODataCollator:
    """Tokenized DPO rows (TRL 1.16's `prompt_ids`, `chosen_ids`, `rejected_ids`) -> TRL v0.7.1's DPO batch, which
    its `concatenated_inputs` / `concatenated_forward` take: `chosen_input_ids`, `chosen_attention_mask`,
    `chosen_labels` (prompt + completion, right-padded; labels are `label_pad_token_id` on the prompt and padding),
    the same for `rejected_*`, and `ref_chosen_logps` / `ref_rejected_logps` (B,) when the rows carry them. With
    `pad_to_multiple_of`, each side's width is rounded up to a multiple of it."""

    def __init__(
        self,
        pad_token_id: int,
        label_pad_token_id: int = -100,
        max_length: int | None = None,
        truncation_mode: TruncationMode = "keep_start",
        pad_to_multiple_of: int | None = None,
    ):
        self.pad_token_id, self.label_pad_token_id = pad_token_id, label_pad_token_id
        self.max_length, self.truncation_mode = max_length, truncation_mode
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features: list[dict]) -> dict[str, Tensor]:
        batch: dict[str, Tensor] = {}
        for side in ("chosen", "rejected"):
            ids, labels = [], []
            for f in features:
                p, c = truncate_pair(
                    list(f["prompt_ids"]), list(f[f"{side}_ids"]), self.max_length, self.truncation_mode
                )
                ids.append(p + c)
                labels.append([self.label_pad_token_id] * len(p) + c)
            k = self.pad_to_multiple_of
            batch[f"{side}_input_ids"] = pad(ids, self.pad_token_id, multiple=k)
            batch[f"{side}_attention_mask"] = pad([[1] * len(r) for r in ids], 0, multiple=k)
            batch[f"{side}_labels"] = pad(labels, self.label_pad_token_id, multiple=k)
        for key in ("ref_chosen_logps", "ref_rejected_logps"):
            if key in features[0]:
                batch[key] = torch.tensor([f[key] for f in features], dtype=torch.float32)
        return batch


class RewardDataCollatorWithPadding:
    """Rows with TRL 1.16's `chosen_ids`, `rejected_ids` -> TRL v0.7.1's reward batch: right-padded
    `input_ids_chosen`, `attention_mask_chosen`, `input_ids_rejected`, `attention_mask_rejected` (B, L) and `margin`
    (B,) when present. With `pad_to_multiple_of`, each side's width is rounded up to a multiple of it."""

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None):
        self.pad_token_id, self.pad_to_multiple_of = pad_token_id, pad_to_multiple_of

    def __call__(self, features: list[dict]) -> dict[str, Tensor]:
        batch: dict[str, Tensor] = {}
        for side in ("chosen", "rejected"):
            ids = [list(f[f"{side}_ids"]) for f in features]
            masks = [[1] * len(i) for i in ids]
            batch[f"input_ids_{side}"] = pad(ids, self.pad_token_id, multiple=self.pad_to_multiple_of)
            batch[f"attention_mask_{side}"] = pad(masks, 0, multiple=self.pad_to_multiple_of)
        if "margin" in features[0] and features[0]["margin"] is not None:
            batch["margin"] = torch.tensor([float(f["margin"]) for f in features], dtype=torch.float32)
        return batch


class DataCollatorForPreference:
    """TRL 1.16's reward collator (`trl.trainer.reward_trainer.DataCollatorForPreference`): rows with `chosen_ids`
    and `rejected_ids` (and optionally `margin`) -> `input_ids` and `attention_mask` (2B, L), every chosen sequence
    first and then every rejected one, right-padded with `pad_token_id` (the width rounded up to a multiple of
    `pad_to_multiple_of` when given), and `margin` (B,) when the rows carry one."""

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None):
        self.pad_token_id, self.pad_to_multiple_of = pad_token_id, pad_to_multiple_of

    def __call__(self, examples: list[dict]) -> dict[str, Tensor]:
        rows = [list(e["chosen_ids"]) for e in examples] + [list(e["rejected_ids"]) for e in examples]
        batch = {
            "input_ids": pad(rows, self.pad_token_id, multiple=self.pad_to_multiple_of),
            "attention_mask": pad([[1] * len(r) for r in rows], 0, multiple=self.pad_to_multiple_of),
        }
        if "margin" in examples[0] and examples[0]["margin"] is not None:
            batch["margin"] = torch.tensor([float(e["margin"]) for e in examples], dtype=torch.float32)
        return batch
