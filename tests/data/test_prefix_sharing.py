"""The prefix-shared layout by hand: ids, positions, what each token may see, which position predicts what."""

from replayrl.data.preference import DPODataCollator
from replayrl.data.prefix_sharing import share_prefixes

P = -100  # label_pad_token_id


def batch(rows, max_length=None, mode="keep_start"):
    collate = DPODataCollator(pad_token_id=0, label_pad_token_id=P, max_length=max_length, truncation_mode=mode)
    return collate([{"prompt_input_ids": p, "chosen_input_ids": c, "rejected_input_ids": r} for p, c, r in rows])


def test_one_pair_by_hand():
    rows = share_prefixes(batch([([11, 12], [21, 22, 23], [31, 32])]), P, 0)
    assert rows.input_ids.tolist() == [[11, 12, 21, 22, 23, 31, 32]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3]]
    # chosen tokens predicted by positions 1, 2, 3; rejected: 31 by the prompt's last position 1, 32 by 31's (5)
    assert rows.sources["chosen"].tolist() == [[1, 2, 3]] and rows.targets["chosen"].tolist() == [[21, 22, 23]]
    assert rows.sources["rejected"].tolist() == [[1, 5]] and rows.targets["rejected"].tolist() == [[31, 32]]
    allowed = rows.attention_allowed()[0, 0].int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 1, 0],  # rejected: the prompt and itself, never the chosen tokens
        [1, 1, 0, 0, 0, 1, 1],
    ]


def test_padding_and_masks_over_pairs_of_different_lengths():
    rows = share_prefixes(batch([([5], [6], [7, 8, 9]), ([1, 2, 3], [4, 4], [9])]), P, 0)
    # the widest pair (6 tokens) sets the width and takes the first row; the other (5) cannot join it
    assert rows.input_ids.tolist() == [[1, 2, 3, 4, 4, 9], [5, 6, 7, 8, 9, 0]]
    assert rows.row_of_pair.tolist() == [1, 0]
    assert rows.target_mask["chosen"].tolist() == [[True, False], [True, True]]
    assert rows.target_mask["rejected"].tolist() == [[True, True, True], [True, False, False]]
    assert rows.sources["rejected"][0].tolist() == [0, 2, 3]
    allowed = rows.attention_allowed()
    assert allowed.shape == (2, 1, 6, 6) and allowed.any(-1).all()  # no empty mask row
    assert allowed[1, 0, 5].tolist() == [False] * 5 + [True]  # padding sees only padding


def test_short_pairs_share_a_row_and_never_see_each_other():
    rows = share_prefixes(batch([([1, 2], [3, 3], [4, 4]), ([5], [6], [7]), ([8], [9], [10])]), P, 0)
    assert rows.input_ids.tolist() == [[1, 2, 3, 3, 4, 4], [5, 6, 7, 8, 9, 10]]
    assert rows.position_ids[1].tolist() == [0, 1, 1, 0, 1, 1]  # positions restart with each pair
    assert rows.row_of_pair.tolist() == [0, 1, 1]
    assert rows.sources["chosen"][2].tolist() == [3, 0] and rows.target_mask["chosen"][2].tolist() == [True, False]
    assert rows.sources["rejected"][2].tolist() == [3, 0] and rows.targets["rejected"][2].tolist() == [10, 0]
    assert rows.attention_allowed()[1, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],  # the third pair starts: nothing of the second is visible
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 1, 0, 1],
    ]


def test_prompts_cut_apart_by_truncation_give_none():
    # keep_end with max_length 4: chosen (3 tokens) keeps 1 prompt token, rejected (1 token) keeps all 3
    assert share_prefixes(batch([([1, 2, 3], [4, 5, 6], [7])], max_length=4, mode="keep_end"), P, 0) is None
    assert share_prefixes(batch([([1, 2, 3], [4, 5, 6], [7])], max_length=5, mode="keep_start"), P, 0) is not None
