"""SFT packing through the public API: the prepared dataset's rows for `bfd`, `bfd_split`, by hand.

The expected rows are TRL 1.16's (`trl.data_utils.pack_dataset`): its binning and tie rule, its truncation
(`bfd`) and splitting (`bfd_split`) of documents longer than `max_length`.
"""

import pytest
from datasets import Dataset

from replayrl import SFTConfig, SFTTrainer
from replayrl.models.tiny import build_tiny_model, build_tokenizer
from tests.sft.helpers import sft_args


def docs(lengths: list[int]) -> list[list[int]]:
    """Pre-tokenised documents of these lengths, each of its own token id (document i is all 10 + i)."""
    return [[10 + i] * n for i, n in enumerate(lengths)]


def packed(tmp_path, lengths: list[int], max_length: int, strategy: str = "bfd", **overrides) -> SFTTrainer:
    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = sft_args(tmp_path, packing=True, max_length=max_length, packing_strategy=strategy, **overrides)
    data = Dataset.from_dict({"input_ids": docs(lengths)})
    return SFTTrainer(model, args=args, train_dataset=data, processing_class=tok)


def test_bfd_rows_follow_trls_tie_rule(tmp_path):
    # 12 -> row0 (room 6); 8 -> row1 (room 10); 8 -> row1 (room 2); 4 -> row0 (room 6 -> 2); the last 2 fits rows 0
    # and 1 alike (room 2 each): TRL gives it to row1, which had room 2 first.
    rows = packed(tmp_path, [12, 8, 8, 4, 2], max_length=18).train_dataset
    assert rows["seq_lengths"] == [[12, 4], [8, 8, 2]]
    assert rows["input_ids"] == [[10] * 12 + [13] * 4, [11] * 8 + [12] * 8 + [14] * 2]


def test_bfd_truncates_and_bfd_split_splits_long_documents(tmp_path):
    # max_length 4. bfd: document 0 (6 tokens) truncated to 4 -> rows [d0[:4]], [d2], [d1].
    rows = packed(tmp_path / "bfd", [6, 2, 3], max_length=4).train_dataset
    assert rows["input_ids"] == [[10] * 4, [12] * 3, [11] * 2]
    # bfd_split: pieces 4, 2 (of d0), 2 (d1), 3 (d2); 4 -> row0; 3 -> row1 (room 1); d0's tail -> row2 (room 2);
    # d1 -> row2 (tightest fit). Every token is kept, d0's tail packed as a document of its own.
    trainer = packed(tmp_path / "split", [6, 2, 3], max_length=4, strategy="bfd_split", per_device_train_batch_size=3)
    rows = trainer.train_dataset
    assert rows["input_ids"] == [[10] * 4, [12] * 3, [10, 10, 11, 11]]
    assert rows["seq_lengths"] == [[4], [3], [2, 2]]
    trainer.train()
    assert trainer.state.log_history[0]["num_tokens"] == 11


def test_bfd_requeue_is_trls_deprecated_name_of_bfd_split(tmp_path):
    with pytest.warns(FutureWarning, match="renamed to `bfd_split`"):
        args = SFTConfig(output_dir=str(tmp_path), packing_strategy="bfd-requeue", report_to="none")
    assert args.packing_strategy == "bfd_split"
    with pytest.raises(ValueError, match="packing_strategy='first_fit'"):
        SFTConfig(output_dir=str(tmp_path), packing_strategy="first_fit", report_to="none")
