"""TRL 1.16's SFT collator (`replayrl.sft.DataCollatorForLanguageModeling`): padded and padding-free batches."""

import torch

from replayrl.sft import DataCollatorForLanguageModeling

ROWS = [{"input_ids": [1, 2, 3], "labels": [1, -100, 3], "completion_mask": [0, 0, 1]}, {"input_ids": [4, 5]}]


def test_padded_batch_keeps_given_labels_and_defaults_the_rest():
    batch = DataCollatorForLanguageModeling(pad_token_id=9, pad_to_multiple_of=4)(ROWS)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].tolist() == [[1, 2, 3, 9], [4, 5, 9, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert batch["labels"].tolist() == [[1, -100, 3, -100], [4, 5, -100, -100]]


def test_position_ids_restart_at_packed_documents():
    packed = [{"input_ids": [1, 2, 3, 4, 5], "seq_lengths": [3, 2]}, {"input_ids": [6, 7]}]
    batch = DataCollatorForLanguageModeling(pad_token_id=0, return_position_ids=True)(packed)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 0, 0, 0]]
    free = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(packed)
    assert set(free) == {"input_ids", "position_ids", "labels"}
    assert free["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7]]
    assert free["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1]]
    assert free["labels"].tolist() == [[-100, 2, 3, -100, 5, -100, 7]]  # no loss on a document's first token
    got = DataCollatorForLanguageModeling.get_position_ids_from_packed_seq_lengths([[2, 1], [3]])
    assert [t.tolist() for t in got] == [[0, 1, 0], [0, 1, 2]]
    assert torch.equal(got[1], torch.arange(3))
