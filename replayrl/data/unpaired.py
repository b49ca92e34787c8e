"""Unpaired preference data (KTO): rows of (prompt, completion, label), label True = desirable.

Accepted rows (TRL's formats), standard (strings) or conversational (lists of messages):
  - unpaired: `prompt`, `completion`, `label` (bool);
  - paired preference rows (`chosen`, `rejected`, optional `prompt`, see `replayrl.data.preference`): each pair
    becomes two rows, chosen with label True and rejected with label False (TRL's `unpair_preference_dataset`).
Token ids are TRL 1.16's KTO ids (`replayrl.data.preference.tokenize_prompt_completions`, as DPO's): text with the
tokenizer's special tokens (a Llama-style BOS first) and the EOS text appended to the completion once, conversations
through the chat template (the row's `tools` / `chat_template_kwargs`), prompt + completion tokenized jointly and
split where it leaves the prompt tokenized alone. The prepared columns are TRL 1.16's: the rows' own columns plus
`prompt_ids` / `completion_ids` (no masks: the collator builds them) and `label`. Rows already in that layout
(`prompt_ids`, `completion_ids`, `label`) are taken as tokenized; replayrl's earlier names `prompt_input_ids` /
`completion_input_ids` are renamed to them (`rename_old_kto_columns`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from replayrl.data.preference import extract_prompt, pad, tokenize_prompt_completions, truncate_pair
from replayrl.data.streaming import column_names

UNPAIRED_COLUMNS = ("prompt", "completion", "label")
KTO_COLUMNS = ("prompt_ids", "completion_ids")  # TRL 1.16's prepared KTO ids
OLD_KTO_COLUMNS = {"prompt_input_ids": "prompt_ids", "completion_input_ids": "completion_ids"}  # replayrl's earlier


def rename_old_kto_columns(dataset):
    """replayrl's earlier pre-tokenized KTO columns `prompt_input_ids`/`completion_input_ids` -> TRL 1.16's
    `prompt_ids`/`completion_ids` (a dataset that already has TRL 1.16's is left as it is)."""
    columns = set(column_names(dataset))
    if set(OLD_KTO_COLUMNS) <= columns and not set(KTO_COLUMNS) & columns:
        return dataset.rename_columns(OLD_KTO_COLUMNS)
    return dataset


def unpaired_kind(columns, name: str = "dataset") -> str:
    """'unpaired', 'paired' (chosen/rejected) or 'tokenized' (TRL 1.16's `prompt_ids`/`completion_ids` + `label`);
    else a ValueError naming the fix. Old column names are renamed before (`rename_old_kto_columns`)."""
    columns = set(columns)
    if {*KTO_COLUMNS, "label"} <= columns:
        return "tokenized"
    if set(UNPAIRED_COLUMNS) <= columns:
        return "unpaired"
    if {"chosen", "rejected"} <= columns:
        return "paired"
    raise ValueError(
        f"{name} is not a KTO dataset: it has columns {sorted(columns)}, expected 'prompt', 'completion' and "
        "'label' (True = desirable), preference pairs 'chosen'/'rejected' (optionally 'prompt'), or the pre-tokenized "
        "'prompt_ids'/'completion_ids' with 'label'. Rename your "
        "columns, e.g. dataset.rename_column('thumbs_up', 'label')."
    )


def unpair_rows(batch: dict[str, list]) -> dict[str, list]:
    """Batched `datasets.map` function: paired rows -> twice as many unpaired rows (chosen True, rejected False),
    other columns (e.g. `tools`, `chat_template_kwargs`) copied to both."""
    others = [key for key in batch if key not in ("prompt", "chosen", "rejected")]
    out: dict[str, list] = {"prompt": [], "completion": [], "label": [], **{key: [] for key in others}}
    for i in range(len(batch["chosen"])):
        row = extract_prompt({key: values[i] for key, values in batch.items()})
        for side, label in (("chosen", True), ("rejected", False)):
            out["prompt"].append(row["prompt"])
            out["completion"].append(row[side])
            out["label"].append(label)
            for key in others:
                out[key].append(row[key])
    return out


def tokenize_unpaired_row(example: dict, tokenizer) -> dict:
    """TRL 1.16's KTO columns `prompt_ids`, `completion_ids` (`tokenize_prompt_completions`) and `label` (bool);
    as a `datasets.map` function the row's other columns are kept."""
    label = example["label"]
    if not isinstance(label, bool) and label not in (0, 1):
        raise ValueError(f"label must be a bool (True = desirable), got {label!r}")
    ids = tokenize_prompt_completions(example, tokenizer, ("completion",))
    return {"prompt_ids": ids["prompt_ids"], "completion_ids": ids["completion_ids"], "label": bool(label)}


class UnpairedDataCollator:
    """Tokenized rows (TRL 1.16's `prompt_ids`, `completion_ids`, `label`) -> ``input_ids``, ``attention_mask``,
    ``completion_mask`` (B, L) right-padded, each row prompt + completion cut to `max_length` from the end
    (keep_start), and ``label`` (B,) bool: TRL 1.16's `DataCollatorForUnpairedPreference` batch. Rows carrying
    TRL's `KL_completion_ids` (each prompt with another row's completion) get the same three tensors for those
    under ``KL_input_ids``, ``KL_attention_mask``, ``KL_completion_mask``, and `ref_logps` / `ref_KL_logps` become
    (B,) tensors, as TRL's; replayrl's trainer reads neither (it builds its mismatched pairs per optimizer step)."""

    def __init__(self, pad_token_id: int, max_length: int | None = None, pad_to_multiple_of: int | None = None):
        self.pad_token_id, self.max_length, self.pad_to_multiple_of = pad_token_id, max_length, pad_to_multiple_of

    def __call__(self, features: list[dict]) -> dict[str, Tensor]:
        batch: dict[str, Tensor] = {}
        for prefix, key in (("", "completion_ids"), ("KL_", "KL_completion_ids")):
            if key in features[0]:
                pairs = [truncate_pair(list(f["prompt_ids"]), list(f[key]), self.max_length, "keep_start")
                         for f in features]  # fmt: skip
                rows = rows_from_pairs(pairs, self.pad_token_id, self.pad_to_multiple_of)
                batch.update({prefix + name: value for name, value in rows.items()})
        for key in ("ref_logps", "ref_KL_logps"):
            if key in features[0]:
                batch[key] = torch.tensor([float(f[key]) for f in features])
        batch["label"] = torch.tensor([bool(f["label"]) for f in features])
        return batch


class DataCollatorForUnpairedPreference(UnpairedDataCollator):
    """TRL 1.16's KTO collator under its name and signature (`trl.trainer.kto_trainer`'s, for code written against
    it): the batch of `UnpairedDataCollator`, which `KTOTrainer` uses by default."""

    def __init__(
        self,
        pad_token_id: int,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        return_tensors: str = "pt",
    ):
        if return_tensors != "pt":
            raise ValueError(f"return_tensors={return_tensors!r}: only 'pt' is supported (as TRL 1.16); pass 'pt'.")
        super().__init__(pad_token_id, max_length, pad_to_multiple_of)


def rows_from_pairs(pairs: list[tuple[list[int], list[int]]], pad_token_id: int, multiple: int | None = None) -> dict:
    """(prompt ids, completion ids) lists -> right-padded ``input_ids``, ``attention_mask``, ``completion_mask``."""
    ids = [p + c for p, c in pairs]
    batch = {
        "input_ids": pad(ids, pad_token_id),
        "attention_mask": pad([[1] * len(r) for r in ids], 0),
        "completion_mask": pad([[0] * len(p) + [1] * len(c) for p, c in pairs], 0),
    }
    if multiple and batch["input_ids"].shape[1] % multiple:
        extra = multiple - batch["input_ids"].shape[1] % multiple
        fills = {"input_ids": pad_token_id, "attention_mask": 0, "completion_mask": 0}
        batch = {k: torch.nn.functional.pad(v, (0, extra), value=fills[k]) for k, v in batch.items()}
    return batch


def split_rows(batch: dict[str, Tensor]) -> list[tuple[list[int], list[int]]]:
    """The (prompt ids, completion ids) of each row of a collated batch (inverse of `rows_from_pairs`)."""
    out = []
    for ids, mask, completion in zip(batch["input_ids"], batch["attention_mask"], batch["completion_mask"]):
        real = ids[mask.bool()].tolist()
        n_prompt = int((mask.bool() & ~completion.bool()).sum())
        out.append((real[:n_prompt], real[n_prompt:]))
    return out
