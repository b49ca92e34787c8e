"""Unpaired (KTO) data: unpairing, tokenising, collating and splitting back."""

import pytest
from datasets import Dataset

from replayrl.data.unpaired import (
    UnpairedDataCollator,
    split_rows,
    tokenize_unpaired_row,
    unpair_rows,
    unpaired_kind,
)


def test_kinds_and_a_clear_error():
    assert unpaired_kind(["prompt", "completion", "label"]) == "unpaired"
    assert unpaired_kind(["chosen", "rejected"]) == "paired"
    with pytest.raises(ValueError, match="expected 'prompt', 'completion' and 'label'.*rename_column"):
        unpaired_kind(["prompt", "answer"])


def test_unpair_splits_each_pair_into_two_labelled_rows():
    pairs = Dataset.from_dict({"chosen": ["1+1=2", "2+2=4"], "rejected": ["1+1=3", "2+2=5"]})
    rows = pairs.map(unpair_rows, batched=True, remove_columns=pairs.column_names)
    assert rows["prompt"] == ["1+1=", "1+1=", "2+2=", "2+2="]
    assert rows["completion"] == ["2", "3", "4", "5"] and rows["label"] == [True, False, True, False]


def test_tokenize_collate_split_round_trip(tokenizer):
    rows = [tokenize_unpaired_row({"prompt": p, "completion": c, "label": lab}, tokenizer)
            for p, c, lab in [("1+1=", "2", True), ("10+10=", "21", False)]]  # fmt: skip
    assert rows[0]["completion_ids"][-1] == tokenizer.eos_token_id
    batch = UnpairedDataCollator(tokenizer.pad_token_id)(rows)
    assert batch["label"].tolist() == [True, False]
    assert batch["completion_mask"].sum(1).tolist() == [2, 3]  # completion + EOS
    assert split_rows(batch) == [(r["prompt_ids"], r["completion_ids"]) for r in rows]
    cut = UnpairedDataCollator(tokenizer.pad_token_id, max_length=7, pad_to_multiple_of=4)(rows)
    assert cut["input_ids"].shape[1] == 8 and cut["attention_mask"].sum(1).tolist() == [6, 7]
    with pytest.raises(ValueError, match="label must be a bool"):
        tokenize_unpaired_row({"prompt": "a", "completion": "b", "label": "yes"}, tokenizer)


def test_trls_collator_name_gives_trls_docstring_batches():
    """TRL 1.16's `DataCollatorForUnpairedPreference` docstring examples, values copied from it."""
    from replayrl.kto import DataCollatorForUnpairedPreference

    collator = DataCollatorForUnpairedPreference(pad_token_id=0)
    rows = [{"prompt_ids": [1, 2, 3], "completion_ids": [4, 5], "label": True},
            {"prompt_ids": [7, 8], "completion_ids": [9], "label": False}]  # fmt: skip
    batch = collator(rows)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert batch["completion_mask"].tolist() == [[0, 0, 0, 1, 1], [0, 0, 1, 0, 0]]
    assert batch["label"].tolist() == [True, False] and not any(k.startswith("KL_") for k in batch)
    rows[0]["KL_completion_ids"], rows[1]["KL_completion_ids"] = [6], [10, 11]
    batch = collator(rows)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 0, 0]]
    assert batch["KL_input_ids"].tolist() == [[1, 2, 3, 6], [7, 8, 10, 11]]
    assert batch["KL_attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]
    assert batch["KL_completion_mask"].tolist() == [[0, 0, 0, 1], [0, 0, 1, 1]]
    with pytest.raises(ValueError, match="only 'pt'"):
        DataCollatorForUnpairedPreference(0, return_tensors="np")
