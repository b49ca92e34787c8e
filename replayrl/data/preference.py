"""Preference data for the DPO and reward trainers: validate, split the prompt off, tokenise, pad.

Accepted rows (TRL's formats), standard (strings) or conversational (lists of {"role", "content"} messages):
  - explicit prompt: `prompt`, `chosen`, `rejected`, the completions without the prompt;
  - implicit prompt: `chosen`, `rejected` only, each the whole text/conversation; the prompt is their common
    prefix (`extract_prompt`);
  - optional `margin` (float): the reward trainer subtracts it inside the Bradley-Terry loss;
  - reward trainer only, TRL v0.7.1's pre-tokenized columns `input_ids_chosen`, `attention_mask_chosen`,
    `input_ids_rejected`, `attention_mask_rejected`, used as they are.
Conversational rows go through the tokenizer's chat template. DPO completions get EOS appended once; reward
sequences only with `append_eos=True` (see `tokenize_reward_row`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from replayrl.data.prompts import is_conversational
from replayrl.data.streaming import is_streaming

logger = logging.getLogger(__name__)

TruncationMode = Literal["keep_start", "keep_end"]
PRETOKENIZED_COLUMNS = ("input_ids_chosen", "attention_mask_chosen", "input_ids_rejected", "attention_mask_rejected")


def dataset_kind(columns: Sequence[str], name: str = "dataset", allow_pretokenized: bool = False) -> str:
    """'pretokenized' (TRL v0.7.1's reward columns), 'tokenized' (our own DPO columns) or 'preference'; else a
    ValueError naming the columns found and the ones expected."""
    columns = list(columns)
    if allow_pretokenized and "input_ids_chosen" in columns and "input_ids_rejected" in columns:
        return "pretokenized"
    if {"prompt_input_ids", "chosen_input_ids", "rejected_input_ids"} <= set(columns):
        return "tokenized"
    if "chosen" in columns and "rejected" in columns:
        return "preference"
    expected = "'chosen' and 'rejected' (optionally 'prompt' and 'margin')"
    if allow_pretokenized:
        expected += ", or the pre-tokenized 'input_ids_chosen'/'input_ids_rejected' (+ attention masks)"
    raise ValueError(
        f"{name} is not a preference dataset: it has columns {columns}, expected {expected}. Rename your columns, "
        "e.g. dataset.rename_column('better', 'chosen')."
    )


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


def _apply_template(tokenizer, prompt, completion) -> tuple[str, str]:
    """Prompt and completion as text; conversations through the chat template, the completion being what the
    template adds after the prompt's generation prompt."""
    if not is_conversational(prompt) and not is_conversational(completion):
        return prompt, completion
    if not (is_conversational(prompt) and is_conversational(completion)):
        raise ValueError("prompt and completion must both be conversations (lists of messages) or both strings")
    prompt_text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(prompt + completion, tokenize=False)
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
    """prompt_input_ids (the last `max_prompt_length` tokens), chosen_input_ids / rejected_input_ids (completion
    tokens + EOS, the first `max_completion_length`). No special tokens are added to the prompt (chat
    templates carry their own)."""
    example = extract_prompt(example)
    prompt_text, chosen_text = _apply_template(tokenizer, example["prompt"], example["chosen"])
    _, rejected_text = _apply_template(tokenizer, example["prompt"], example["rejected"])
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt_ids = encode(prompt_text)
    chosen_ids = _with_eos(encode(chosen_text), tokenizer.eos_token_id)
    rejected_ids = _with_eos(encode(rejected_text), tokenizer.eos_token_id)
    if max_prompt_length is not None:
        prompt_ids = prompt_ids[-max_prompt_length:]
    if max_completion_length is not None:
        chosen_ids, rejected_ids = chosen_ids[:max_completion_length], rejected_ids[:max_completion_length]
    return {"prompt_input_ids": prompt_ids, "chosen_input_ids": chosen_ids, "rejected_input_ids": rejected_ids}


def tokenize_reward_row(example: dict, tokenizer, append_eos: bool = False) -> dict:
    """TRL v0.7.1's reward columns: whole sequences (prompt + completion, + EOS if `append_eos`) for chosen and
    rejected, with masks. `prompt` is optional: without it chosen/rejected are the whole texts or conversations.
    EOS is off by default because GRPO scores `prompt + completion` text decoded without special tokens: a
    model trained on sequences ending in EOS would be read at a different position there."""
    out = {}
    for side in ("chosen", "rejected"):
        prompt, completion = example.get("prompt"), example[side]
        if prompt is None:
            if is_conversational(completion):
                text = tokenizer.apply_chat_template(completion, tokenize=False)
            else:
                text = completion
        else:
            text = "".join(_apply_template(tokenizer, prompt, completion))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if append_eos:
            ids = _with_eos(ids, tokenizer.eos_token_id)
        out[f"input_ids_{side}"], out[f"attention_mask_{side}"] = ids, [1] * len(ids)
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
    """DPO rows (`prompt_input_ids`) -> the rows that keep a completion token under `truncation_mode="keep_start"`.
    As TRL 1.16: under `keep_start`, a pair whose prompt (after `max_prompt_length`) alone fills `max_length`
    would keep no completion token in the collator, so no learning signal: it is dropped (a streaming dataset:
    lazily, without the count). `keep_end` keeps the completions' ends, so nothing is dropped there."""

    def has_room(row):
        return len(row["prompt_input_ids"]) < max_length

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


class DPODataCollator:
    """Tokenized DPO rows -> TRL v0.7.1's DPO batch: `chosen_input_ids`, `chosen_attention_mask`, `chosen_labels`
    (prompt + completion, right-padded; labels are `label_pad_token_id` on the prompt and padding), the same
    for `rejected_*`, and `ref_chosen_logps` / `ref_rejected_logps` (B,) when the rows carry them. With
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
                    list(f["prompt_input_ids"]), list(f[f"{side}_input_ids"]), self.max_length, self.truncation_mode
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
    """Seed columns -> right-padded `input_ids_chosen`, `attention_mask_chosen`, `input_ids_rejected`,
    `attention_mask_rejected` (B, L) and `margin` (B,) when present. A missing mask means all ones. With
    `pad_to_multiple_of`, each side's width is rounded up to a multiple of it."""

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None):
        self.pad_token_id, self.pad_to_multiple_of = pad_token_id, pad_to_multiple_of

    def __call__(self, features: list[dict]) -> dict[str, Tensor]:
        batch: dict[str, Tensor] = {}
        for side in ("chosen", "rejected"):
            ids = [list(f[f"input_ids_{side}"]) for f in features]
            masks = [list(f.get(f"attention_mask_{side}") or [1] * len(i)) for f, i in zip(features, ids)]
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
