"""The prefix-shared layout by hand: ids, positions, what each token may see, which column predicts what."""

import torch

from replayrl.data.preference import DPODataCollator
from replayrl.data.prefix_sharing import completion_targets, share_prefixes

P = -100  # label_pad_token_id


def collate(rows, max_length=None, mode="keep_start"):
    collator = DPODataCollator(pad_token_id=0, label_pad_token_id=P, max_length=max_length, truncation_mode=mode)
    return collator([{"prompt_ids": p, "chosen_ids": c, "rejected_ids": r} for p, c, r in rows])


def share(batch):
    return share_prefixes(
        batch["chosen_input_ids"], batch["chosen_attention_mask"],
        batch["rejected_input_ids"], batch["rejected_attention_mask"], 0,
    )  # fmt: skip


def targets(batch, rows, side):
    completion = batch[f"{side}_labels"] != P
    starts = torch.where(completion.any(1), completion.int().argmax(1), rows.lengths[side])
    return [t.tolist() for t in completion_targets(rows, side, batch[f"{side}_input_ids"], starts)]


def test_one_pair_by_hand():
    batch = collate([([11, 12], [21, 22, 23], [31, 32])])
    rows = share(batch)
    assert rows.input_ids.tolist() == [[11, 12, 21, 22, 23, 31, 32]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3]]
    # chosen tokens predicted by columns 1, 2, 3; rejected: 31 by the prompt's last column 1, 32 by 31's (5)
    assert targets(batch, rows, "chosen") == [[[21, 22, 23]], [[1, 2, 3]], [[True] * 3]]
    assert targets(batch, rows, "rejected") == [[[31, 32]], [[1, 5]], [[True] * 2]]
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


def test_the_shared_prefix_runs_into_completions_that_start_alike():
    batch = collate([([7], [8, 9, 4], [8, 5])])  # both completions start with 8
    rows = share(batch)
    assert rows.input_ids.tolist() == [[7, 8, 9, 4, 5]] and rows.prefix_lengths.tolist() == [2]
    assert rows.position_ids.tolist() == [[0, 1, 2, 3, 2]]
    assert targets(batch, rows, "chosen") == [[[8, 9, 4]], [[0, 1, 2]], [[True] * 3]]
    assert targets(batch, rows, "rejected") == [[[8, 5]], [[0, 1]], [[True] * 2]]  # 5 is predicted by 8's column
    assert rows.positions("rejected", torch.tensor([[0, 1]])).tolist() == [[0, 1]]


def test_padding_and_masks_over_pairs_of_different_lengths():
    batch = collate([([5], [6], [7, 8, 9]), ([1, 2, 3], [4, 4], [9])])
    rows = share(batch)
    # the widest pair (6 tokens) sets the width and takes the first row; the other (5) cannot join it
    assert rows.input_ids.tolist() == [[1, 2, 3, 4, 4, 9], [5, 6, 7, 8, 9, 0]]
    assert rows.row_of_pair.tolist() == [1, 0]
    assert targets(batch, rows, "chosen")[2] == [[True, False], [True, True]]
    assert targets(batch, rows, "rejected")[1:] == [[[0, 2, 3], [2, 0, 0]], [[True] * 3, [True, False, False]]]
    allowed = rows.attention_allowed()
    assert allowed.shape == (2, 1, 6, 6) and allowed.any(-1).all()  # no empty mask row
    assert allowed[1, 0, 5].tolist() == [False] * 5 + [True]  # padding sees only padding


def test_short_pairs_share_a_row_and_never_see_each_other():
    batch = collate([([1, 2], [3, 3], [4, 4]), ([5], [6], [7]), ([8], [9], [10])])
    rows = share(batch)
    assert rows.input_ids.tolist() == [[1, 2, 3, 3, 4, 4], [5, 6, 7, 8, 9, 10]]
    assert rows.position_ids[1].tolist() == [0, 1, 1, 0, 1, 1]  # positions restart with each pair
    assert rows.row_of_pair.tolist() == [0, 1, 1] and rows.offsets.tolist() == [0, 0, 3]
    chosen_targets, chosen_sources, chosen_mask = targets(batch, rows, "chosen")
    assert chosen_targets[2][:1] == [9] and chosen_sources[2][:1] == [3] and chosen_mask[2] == [True, False]
    assert targets(batch, rows, "rejected")[1][2][:1] == [3]  # 10 predicted by 8's column, not 9's
    assert rows.attention_allowed()[1, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],  # the third pair starts: nothing of the second is visible
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 1, 0, 1],
    ]


def test_prompts_cut_apart_by_truncation_share_what_is_common():
    # keep_end with max_length 4: chosen (3 tokens) keeps 1 prompt token [3], rejected (1 token) keeps [1, 2, 3]
    batch = collate([([1, 2, 3], [4, 5, 6], [7])], max_length=4, mode="keep_end")
    rows = share(batch)
    assert rows.prefix_lengths.tolist() == [0] and rows.input_ids.tolist() == [[3, 4, 5, 6, 1, 2, 3, 7]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert targets(batch, rows, "rejected")[:2] == [[[7]], [[6]]]
    assert not rows.attention_allowed()[0, 0, 4:, :4].any()  # two independent sequences
