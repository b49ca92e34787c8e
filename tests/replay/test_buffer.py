"""ReplayBuffer units: capacity/eviction, ties, empty, sampling proportions, age/reuse limits, state."""

import pytest
import torch

from replayrl.grpo.rollout import Rollout
from replayrl.replay import ReplayBuffer, group_score


def group(tag: int, G: int = 2, P: int = 3, C: int = 4, prompt_len: int = 2, completion_len: int = 3) -> Rollout:
    pm = torch.zeros(G, P, dtype=torch.long)
    pm[:, P - prompt_len :] = 1
    cm = torch.zeros(G, C, dtype=torch.long)
    cm[:, :completion_len] = 1
    return Rollout(
        prompt_ids=torch.full((G, P), tag) * pm,
        prompt_mask=pm,
        completion_ids=torch.full((G, C), tag) * cm,
        completion_mask=cm,
        rewards=torch.tensor([0.0, 1.0]),
        advantages=torch.tensor([-0.7, 0.7]),
        policy_version=torch.zeros(G, dtype=torch.long),
        replayed=torch.zeros(G, dtype=torch.bool),
        truncated=torch.zeros(G, dtype=torch.bool),
        old_logps=-torch.ones(G, C),
    )


def tags(buffer):
    return sorted(int(g.rollout.prompt_ids[0, -1]) for g in buffer.groups)


def test_capacity_keeps_the_highest_scores():
    buf = ReplayBuffer(2)
    assert buf.add(group(1), 1.0, 0) and buf.add(group(2), 3.0, 0)
    assert buf.add(group(3), 2.0, 0)  # evicts score 1.0
    assert not buf.add(group(4), 0.5, 0)  # scores below everything kept: dropped
    assert tags(buf) == [2, 3]


def test_equal_scores_never_crash_and_evict_the_oldest():
    buf = ReplayBuffer(2)
    for t in range(5):
        buf.add(group(t), 1.0, 0)
    assert len(buf) == 2 and tags(buf) == [0, 1]  # equal newcomers do not displace equals
    assert len(buf.sample(2)) == 2


def test_empty_and_small_buffers_return_what_they_have():
    buf = ReplayBuffer(4)
    assert buf.sample(3) == []
    buf.add(group(1), 1.0, 0)
    assert len(buf.sample(3)) == 1  # shortfall is the caller's to log
    assert ReplayBuffer(0).add(group(1), 1.0, 0) is False


def test_stored_groups_are_trimmed_cpu_copies():
    g = group(7, P=5, C=6, prompt_len=2, completion_len=3)
    buf = ReplayBuffer(1)
    buf.add(g, 1.0, 0)
    stored = buf.groups[0].rollout
    assert stored.prompt_ids.shape == (2, 2) and stored.completion_ids.shape == (2, 3)
    assert stored.prompt_ids.untyped_storage().data_ptr() != g.prompt_ids.untyped_storage().data_ptr()
    assert torch.equal(stored.prompt_ids, g.prompt_ids[:, -2:])  # left padding removed, prompt kept


def test_sampling_is_proportional_to_score_under_a_seed():
    counts = torch.zeros(3)
    for seed in range(3000):
        buf = ReplayBuffer(3, seed=seed)
        for t, s in enumerate([1.0, 2.0, 7.0]):
            buf.add(group(t), s, 0)
        counts[int(buf.sample(1)[0].rollout.prompt_ids[0, -1])] += 1
    assert torch.allclose(counts / counts.sum(), torch.tensor([0.1, 0.2, 0.7]), atol=0.03)


def test_same_seed_same_draws():
    def draws(seed):
        buf = ReplayBuffer(5, seed=seed)
        for t in range(5):
            buf.add(group(t), float(t + 1), 0)
        return [g.uid for _ in range(4) for g in buf.sample(2)]

    assert draws(3) == draws(3)


def test_max_age_and_max_reuse():
    buf = ReplayBuffer(4, max_age=2, max_reuse=2)
    buf.add(group(1), 1.0, version=0)
    buf.add(group(2), 1.0, version=3)
    assert buf.evict_stale(current_version=3) == 1 and tags(buf) == [2]
    buf.sample(1)
    assert len(buf) == 1
    buf.sample(1)  # second use reaches max_reuse: gone
    assert len(buf) == 0


def test_scores():
    r, a = torch.tensor([0.0, 1.0, 1.0, 0.0]), torch.tensor([-0.866, 0.866, 0.866, -0.866])
    assert group_score(r, a, "adv_std") == pytest.approx(4 * 0.866 * 0.57735, rel=1e-3)
    assert group_score(r, a, "variance") == pytest.approx(1 / 3, rel=1e-4)  # p(1-p) * G/(G-1)
    assert group_score(r, a, "uniform") == 1.0
    with pytest.raises(ValueError, match="replay score"):
        group_score(r, a, "best")


def test_state_round_trip_continues_identically():
    buf = ReplayBuffer(3, seed=1, max_reuse=5)
    for t in range(3):
        buf.add(group(t), float(t + 1), t)
    buf.sample(1)
    clone = ReplayBuffer(1)
    clone.load_state_dict(buf.state_dict())
    assert [g.uid for g in clone.sample(2)] == [g.uid for g in buf.sample(2)]
    assert [(g.score, g.version, g.reuse) for g in clone.groups] == [(g.score, g.version, g.reuse) for g in buf.groups]
