"""Rollout-level replay (`replay_unit="rollout"`, arXiv 2606.04560): each zero-std group of a batch earns G buffered
rollouts drawn across the whole buffer by priority (|A| or max(A, 0)), appended to the fresh batch. Pure parts with
hand-computed values; the trainer through `train()`, checking what reached the loss (exact resume:
test_replay_candidates.py)."""

import pytest
import torch

from replayrl import GRPOWithReplayBufferConfig
from replayrl.algos import zero_std_groups
from replayrl.replay.buffer import ReplayBuffer, rollout_priority
from tests.replay.test_buffer import group
from tests.replay.test_replay_candidates import _same_rows, make


def test_rollout_priority_by_hand():
    advantages = torch.tensor([2.0, -0.5, 0.0, -1.5])
    assert rollout_priority(advantages, "abs_advantage").tolist() == [2.0, 0.5, 0.0, 1.5]
    assert rollout_priority(advantages, "positive_advantage").tolist() == [2.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="'abs_advantage' or 'positive_advantage'"):
        rollout_priority(advantages, "rank")


def _group(advantages: list[float], tag: int):
    """test_buffer's group of len(advantages) rows, with these advantages (and rewards)."""
    values = torch.tensor(advantages)
    return group(tag, G=len(advantages)).with_(rewards=values, advantages=values)


def test_sample_rollouts_draws_distinct_prioritised_rows_and_counts_one_reuse_per_group():
    buffer = ReplayBuffer(4, seed=0, max_reuse=2)
    buffer.add(_group([1.5, -0.5, -0.5, -0.5], 1), 1.0, 0)
    buffer.add(_group([0.5, 0.5, -1.0, 0.0], 2), 1.0, 1)
    assert buffer.num_rollouts("positive_advantage") == 3 and buffer.num_rollouts("abs_advantage") == 7
    drawn = buffer.sample_rollouts(10, "positive_advantage")  # more asked than there are: every positive row once
    assert sorted((g.uid, i) for g, i in drawn) == [(0, 0), (1, 0), (1, 1)]
    assert [g.reuse for g in buffer.groups] == [1, 1]  # one reuse per group per draw, not per row
    assert len(buffer.sample_rollouts(7, "abs_advantage")) == 7
    assert buffer.groups == []  # both reached max_reuse=2
    # probability proportional to |A|: the 1.5 row against the three 0.5 rows of one group, one row per draw
    counts = torch.zeros(4)
    for seed in range(400):
        b = ReplayBuffer(4, seed=seed)
        b.add(_group([1.5, -0.5, -0.5, -0.5], 1), 1.0, 0)
        counts[b.sample_rollouts(1, "abs_advantage")[0][1]] += 1
    assert counts[0] / counts.sum() == pytest.approx(0.5, abs=0.08)  # 1.5 / (1.5 + 3 * 0.5)


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # the default: max(A, 0)
        {"replay_rollout_priority": "abs_advantage"},
        {"gradient_accumulation_steps": 2, "steps_per_generation": 2},
    ],
)
def test_each_zero_std_group_earns_g_buffered_rollouts_on_top_of_the_fresh_batch(
    tokenizer, dataset, tmp_path, overrides
):
    trainer = make(tokenizer, dataset, tmp_path, replay_unit="rollout", **overrides)
    trainer.train()
    G = trainer.num_generations
    positive = trainer.args.replay_rollout_priority == "positive_advantage"
    earlier, appended_total = [], 0
    for fresh, trained, _, step in trainer.batches:
        n = fresh.num_rows
        head = trained.rows(slice(0, n))
        assert _same_rows(head.trim(), fresh.trim()) and not head.replayed.any()  # nothing fresh is thrown away
        n_zero = int(zero_std_groups(fresh.rewards, G).sum())
        added = trained.num_rows - n
        assert added % G == 0 and added <= n_zero * G  # whole pseudo-groups of G rollouts
        tail = trained.rows(slice(n, None))
        assert tail.replayed.all() and (tail.policy_version < step).all()
        for i in range(added):  # each appended row is a row generated at an earlier step, with its advantage
            row = tail.rows(slice(i, i + 1)).trim()
            assert any(_same_rows(row, e) for e in earlier), "an appended rollout is no earlier generated rollout"
            assert (row.advantages > 0).all() if positive else (row.advantages != 0).all()
            assert torch.isfinite(row.old_logps[row.completion_mask.bool()]).all()  # its behaviour log-probs
        appended_total += added
        earlier += [fresh.rows(slice(i, i + 1)).trim() for i in range(n)]
    assert appended_total > 0
    assert sum(b.num_rows for b in trainer.seen) == sum(t.num_rows for _, t, _, _ in trainer.batches)
    logs = [h for h in trainer.state.log_history if "replay/rollouts_appended" in h]
    assert sum(h["replay/rollouts_appended"] for h in logs) == appended_total
    assert sum(h["replay/groups_replaced"] for h in logs) == appended_total / G


def test_a_bad_unit_or_priority_is_refused(tmp_path):
    with pytest.raises(ValueError, match="replay_unit must be 'group' or 'rollout'.*'row'"):
        GRPOWithReplayBufferConfig(output_dir=str(tmp_path), replay_unit="row")
    with pytest.raises(ValueError, match="replay_rollout_priority must be .*'rank'"):
        GRPOWithReplayBufferConfig(output_dir=str(tmp_path), replay_rollout_priority="rank")
