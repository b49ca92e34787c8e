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
Token ids are TRL 1.16's for the same rows: text is tokenized with the tokenizer's special tokens (a Llama-style BOS
first; none for Qwen), conversations through the chat template (with the row's own `chat_template_kwargs` and `tools`
columns), and DPO's prompt + completion jointly, split where it leaves the prompt tokenized alone. Text completions
get the EOS text appended once (DPO; reward sequences only with `append_eos=True`, see `tokenize_reward_row`);
conversations none (the template ends the turn). Tokenizing keeps the row's other columns, as TRL 1.16's prepared
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
from replayrl.data.streaming import column_names, drop_rows

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
    """Split an implicit prompt off `chosen` and `rejected`, as TRL 1.16's `extract_prompt`: the prompt is their
    longest common prefix (whole messages for conversations; characters for text, a space just before the first
    difference going to the completions). Rows that already have a `prompt` are returned unchanged."""
    if "prompt" in example and example["prompt"] is not None:
        return example
    chosen, rejected = example["chosen"], example["rejected"]
    n = common_prefix_length(chosen, rejected)
    if n == 0 or n == len(chosen) or n == len(rejected):
        raise ValueError(
            "cannot extract an implicit prompt: chosen and rejected must share a non-empty prefix and differ "
            f"after it (chosen={chosen!r}, rejected={rejected!r}); give an explicit 'prompt' column instead."
        )
    if isinstance(chosen, str) and chosen[n - 1] == " " and n > 1:
        n -= 1
    return {**example, "prompt": chosen[:n], "chosen": chosen[n:], "rejected": rejected[n:]}


def check_same_kind(prompt, *completions) -> bool:
    """True when the prompt and completions are conversations (lists of messages), False when all are strings; a
    mix is a ValueError."""
    kinds = {is_conversational(value) for value in (prompt, *completions)}
    if len(kinds) > 1:
        raise ValueError("prompt and completion must both be conversations (lists of messages) or both strings")
    return kinds.pop()


def tokenize_text_or_chat(tokenizer, value, **template_kwargs) -> list[int]:
    """Token ids as TRL 1.16's `_tokenize`: a conversation through the chat template (`tokenize=True`, which adds no
    special tokens of its own: the template writes any BOS), text through `tokenizer(text)` with the tokenizer's
    special tokens (a Llama-style BOS first; none for Qwen). `template_kwargs` apply to conversations only."""
    if is_conversational(value):
        out = tokenizer.apply_chat_template(value, tokenize=True, return_dict=True, **template_kwargs)
        return list(out["input_ids"])
    return list(tokenizer(text=value)["input_ids"])


def common_prefix_length(ids: Sequence[int], other: Sequence[int]) -> int:
    """How many leading tokens `ids` and `other` share."""
    n = 0
    while n < min(len(ids), len(other)) and ids[n] == other[n]:
        n += 1
    return n


_warned_prompt_split = False


def prompt_split(tokenizer, prompt_ids: list[int], *full_ids: list[int]) -> int:
    """Where the completion starts in each tokenized prompt + completion, as TRL 1.16: after the tokens they all share
    with the prompt tokenized alone. Short of the whole prompt (a chat template that renders the prompt alone
    differently, or tokens merging across the boundary), TRL 1.16's warning is logged once."""
    global _warned_prompt_split
    n = min(common_prefix_length(prompt_ids, ids) for ids in full_ids)
    if n < len(prompt_ids) and not _warned_prompt_split:
        _warned_prompt_split = True
        logger.warning(
            "The tokenized prompt is not a prefix of the tokenized prompt+completion, usually because the chat "
            "template renders the prompt alone differently or because tokens merge across the boundary. The "
            "completion starts where they diverge, and this end of the prompt is left out of the training sequence: "
            "%r. The model is trained on a context that differs from the one it sees at inference. To avoid it, use "
            "a chat template that renders the prompt the same way in both cases, or end the prompt on a token "
            "boundary. This warning is shown once, but it likely applies to every example in the dataset.",
            tokenizer.decode(prompt_ids[n:]),
        )
    return n


def with_eos_text(text: str, eos_token: str | None) -> str:
    """TRL 1.16's EOS for text completions: the EOS token's text appended unless the text already ends with it."""
    return text if eos_token is None or text.endswith(eos_token) else text + eos_token


def tokenize_prompt_completions(example: dict, tokenizer, sides: Sequence[str]) -> dict:
    """TRL 1.16's DPO/KTO tokenization of one row: `prompt_ids` and `{side}_ids` for each completion column in
    `sides`. Text completions get the EOS text appended (once); prompt + completion is tokenized jointly
    (`tokenize_text_or_chat`: special tokens for text, the chat template for conversations, the row's `tools` /
    `chat_template_kwargs`) and split where it leaves the prompt tokenized alone (`prompt_split`)."""
    conversational = check_same_kind(example["prompt"], *(example[side] for side in sides))
    kwargs = row_chat_template_kwargs(example) if conversational else {}
    prompt = example["prompt"]
    completions = {side: example[side] for side in sides}
    if not conversational:
        completions = {side: with_eos_text(text, tokenizer.eos_token) for side, text in completions.items()}
    generation_prompt = {"add_generation_prompt": True} if conversational else {}
    prompt_ids = tokenize_text_or_chat(tokenizer, prompt, **kwargs, **generation_prompt)
    full = {side: tokenize_text_or_chat(tokenizer, prompt + value, **kwargs) for side, value in completions.items()}
    n = prompt_split(tokenizer, prompt_ids, *full.values())
    return {"prompt_ids": prompt_ids[:n], **{f"{side}_ids": ids[n:] for side, ids in full.items()}}


def tokenize_dpo_row(
    example: dict, tokenizer, max_prompt_length: int | None = None, max_completion_length: int | None = None
) -> dict:
    """TRL 1.16's DPO columns (`tokenize_prompt_completions`): prompt_ids (with the tokenizer's special tokens for
    text, e.g. a BOS), chosen_ids / rejected_ids (text: + EOS), then cut: the prompt to its last
    `max_prompt_length` tokens, the completions to their first `max_completion_length` (replayrl's options; TRL
    1.16 has neither). `prompt`, `chosen`, `rejected` are kept as given (an implicit prompt split off)."""
    example = extract_prompt(example)
    ids = tokenize_prompt_completions(example, tokenizer, ("chosen", "rejected"))
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
    """TRL 1.16's reward columns `chosen_ids`, `rejected_ids`: whole sequences (`prompt` + completion when the row
    has a prompt, else the whole text/conversation), tokenized as TRL 1.16 (`tokenize_text_or_chat`: text with the
    tokenizer's special tokens, e.g. a BOS; conversations through the chat template with the row's `tools` /
    `chat_template_kwargs`); no masks (the collator builds them). EOS text is appended to text sequences only with
    `append_eos` (TRL always does; conversations never get one): replayrl's GRPO scores `prompt + completion`
    text, which has none, and a model trained on sequences ending in EOS would be read at a different position."""
    out, kwargs = {}, row_chat_template_kwargs(example)
    prompt = example.get("prompt")
    for side in ("chosen", "rejected"):
        value = example[side]
        if prompt is not None:
            check_same_kind(prompt, value)
            value = prompt + value
        if append_eos and not is_conversational(value):
            value = with_eos_text(value, tokenizer.eos_token)
        out[f"{side}_ids"] = tokenize_text_or_chat(tokenizer, value, **kwargs)
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

    return drop_rows(
        dataset,
        has_room,
        f"Dropping fully truncated examples from {name}",
        f"every pair of {name} has a prompt of max_length={max_length} tokens or more, so truncation_mode="
        "'keep_start' would cut every completion away: raise max_length, lower max_prompt_length (the "
        "prompt keeps its last tokens), or set truncation_mode='keep_end'.",
        f"{name}: dropped %d of %d pairs whose prompt fills max_length={max_length} (truncation_mode='keep_start' "
        "would leave them no completion token)",
    )


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
