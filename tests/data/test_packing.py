import pytest
import torch

from replayrl.data.collators import SFTDataCollator
from replayrl.data.packing import (
    additive_mask,
    best_fit_decreasing,
    block_causal_mask,
    pack_bfd,
    pack_dataset_bfd,
    pack_wrapped,
    position_ids_from_lengths,
    split_lengths,
)
from replayrl.models.tiny import build_tiny_model, build_tokenizer


def test_best_fit_decreasing_by_hand():
    # longest first: 5 -> bin0 (room 3); 4 -> new bin1 (room 4); 3 -> bin0 (tightest fit, room 0);
    # 3 -> bin1 (room 1); 2 fits nowhere -> bin2 (room 6); 1 -> bin1 (room 1 is tighter than 6)
    assert best_fit_decreasing([5, 4, 3, 3, 2, 1], 8) == [[0, 2], [1, 3, 5], [4]]


def test_best_fit_decreasing_ties_go_to_the_row_that_reached_the_room_first():
    # TRL 1.16's _pack_bfd rule. 6 -> row0 (room 3); 4 -> row1 (room 5); 4 -> row1 (room 1, reached first);
    # 2 -> row0 (room 3 is the tightest fit; room 1 now); 1: rows 0 and 1 both have room 1, row1 had it first.
    # (Lowest row index first would give [[0, 3, 4], [1, 2]].)
    assert best_fit_decreasing([6, 4, 4, 2, 1], 9) == [[0, 3], [1, 2, 4]]


def test_best_fit_decreasing_drops_empty_documents():
    assert best_fit_decreasing([0, 3, 0, 2], 4) == [[1], [3]]


def test_bfd_split_cuts_long_documents_into_pieces_packed_on_their_own():
    # TRL 1.16's pack_dataset docstring example. Pieces: [1-4] (4), [5] (1), [6, 7] (2), [8-10] (3), [11] (1);
    # longest first: 4 -> row0 (full); 3 -> row1 (room 1); 2 -> row2 (room 2); [5] -> row1 (tightest); [11] -> row2.
    columns = {"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]]}
    packed = pack_bfd(columns, 4, split=True)
    assert packed["input_ids"] == [[1, 2, 3, 4], [8, 9, 10, 5], [6, 7, 11]]
    assert packed["seq_lengths"] == [[4], [3, 1], [2, 1]]
    assert split_lengths([5, 2, 3, 1], 4) == [4, 1, 2, 3, 1]
    # bfd keeps documents whole, so the first must be truncated (to [1-4]) before packing
    truncated = pack_bfd({"input_ids": [[1, 2, 3, 4], [6, 7], [8, 9, 10], [11]]}, 4)
    assert truncated["input_ids"] == [[1, 2, 3, 4], [8, 9, 10, 11], [6, 7]]
    assert truncated["seq_lengths"] == [[4], [3, 1], [2]]


def test_best_fit_decreasing_rejects_documents_longer_than_a_row():
    with pytest.raises(ValueError, match="document of 9 tokens exceeds capacity 8"):
        best_fit_decreasing([9, 1], 8)


def test_pack_bfd_keeps_every_document_whole():
    columns = {"input_ids": [[1] * 5, [2] * 4, [3] * 3], "completion_mask": [[0] * 5, [1] * 4, [0, 1, 1]]}
    packed = pack_bfd(columns, 8)
    assert packed["input_ids"] == [[1] * 5 + [3] * 3, [2] * 4]
    assert packed["completion_mask"] == [[0] * 5 + [0, 1, 1], [1] * 4]
    assert packed["seq_lengths"] == [[5, 3], [4]]


def test_arrow_packing_equals_the_list_reference():
    import random

    from datasets import Dataset

    rng = random.Random(0)
    docs = [[rng.randrange(100) for _ in range(rng.randint(1, 32))] for _ in range(200)]
    data = Dataset.from_dict({"input_ids": docs, "completion_mask": [[i % 2 for i in range(len(d))] for d in docs]})
    data = data.select(range(5, 180))  # a view with an indices mapping, as after shuffle/select
    expected = pack_bfd({name: data[name] for name in data.column_names}, 32)
    assert pack_dataset_bfd(data, 32).to_dict() == expected
    split = pack_bfd({name: data[name] for name in data.column_names}, 12, split=True)
    assert pack_dataset_bfd(data, 12, split=True).to_dict() == split
    assert sum(map(sum, split["seq_lengths"])) == sum(map(len, data["input_ids"]))  # no token lost


def test_pack_wrapped_splits_documents_at_row_ends():
    packed = pack_wrapped({"input_ids": [[1] * 5, [2] * 4, [3] * 3]}, 4)
    assert packed["input_ids"] == [[1] * 4, [1, 2, 2, 2], [2, 3, 3, 3]]
    assert packed["seq_lengths"] == [[4], [1, 3], [1, 3]]


def test_position_ids_restart_per_document():
    assert position_ids_from_lengths([3, 2], 7) == [0, 1, 2, 0, 1, 0, 1]


def test_block_causal_mask_by_hand():
    mask = block_causal_mask([[2, 1]], 4)[0, 0].int().tolist()
    assert mask == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]  # last row: padding, itself only
    float_mask = additive_mask(block_causal_mask([[2, 1]], 4))
    assert float_mask[0, 0, 1, 0] == 0 and float_mask[0, 0, 0, 1] == torch.finfo(torch.float32).min


def test_collator_masks_each_packed_documents_first_label():
    batch = SFTDataCollator(pad_token_id=0)([{"input_ids": [5, 6, 7, 8, 9], "seq_lengths": [3, 2]}])
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["attention_mask"].shape == (1, 1, 5, 5) and batch["attention_mask"].dtype == torch.bool
    assert batch["token_mask"].tolist() == [[1, 1, 1, 1, 1]]  # real tokens (the MoE router loss counts them)


def test_padding_free_flattens_the_batch():
    features = [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}]
    batch = SFTDataCollator(pad_token_id=0, padding_free=True)(features)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]


def test_flash_attention_batches_are_flat_with_sequence_boundaries():
    features = [{"input_ids": [5, 6, 7, 8, 9], "seq_lengths": [3, 2]}, {"input_ids": [4, 3]}]
    collate = SFTDataCollator(pad_token_id=0, attn_implementation="flash_attention_2", pad_to_multiple_of=8)
    batch = collate(features)
    assert "attention_mask" not in batch  # the varlen kernels take the boundaries instead
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 4, 3, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9, -100, 3, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 0]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5, 7, 8] and batch["max_length_q"] == 3
    assert batch["token_count"].item() == 7
    assert batch["token_mask"].tolist() == [[1, 1, 1, 1, 1, 1, 1, 0]]
    # unpacked rows without padding_free keep the ordinary padded batch and 2-D mask
    plain = collate([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    assert plain["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_each_document_alone(attn):
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1).eval()
    model.set_attn_implementation(attn)
    docs = [tokenizer(t, add_special_tokens=False).input_ids for t in ("hello world", "3+4=7", "packing!")]
    features = [{"input_ids": [t for d in docs for t in d], "seq_lengths": [len(d) for d in docs]}]
    batch = SFTDataCollator(pad_token_id=tokenizer.pad_token_id, attn_implementation=attn, pad_to_multiple_of=32)(
        features
    )
    assert batch["input_ids"].shape[1] == 32  # with padding after the documents
    batch.pop("labels"), batch.pop("token_count"), batch.pop("token_mask")
    with torch.no_grad():
        packed = model(**batch).logits[0]
        alone = torch.cat([model(input_ids=torch.tensor([d])).logits[0] for d in docs])
        # without the block mask, position ids alone let documents see each other (why the mask exists)
        leaky = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
    n = alone.shape[0]
    assert torch.allclose(packed[:n], alone, atol=1e-5), (packed[:n] - alone).abs().max()
    assert (leaky[:n] - alone).abs().max() > 1e-2
