"""TRL's ReplayBuffer code path (trl.experimental.grpo_with_replay_buffer) runs unchanged on replayrl's."""

import pytest
import torch

from replayrl import ReplayBuffer


def test_trl_replay_buffer_code_path():
    buffer = ReplayBuffer(max_size=3)
    assert buffer.sample(2) is None  # empty: None, as TRL
    data = [{"prompt_ids": torch.tensor([i])} for i in range(5)]
    buffer.add([0.5, 0.1, 0.9, 0.3, 0.7], data)
    assert len(buffer.heap) == 3 and buffer.max_size == 3
    assert buffer.heap[0][0] == pytest.approx(0.5)  # min-heap: the worst kept score first
    kept = sorted(int(d["prompt_ids"]) for _, d in buffer.heap)
    assert kept == [0, 2, 4]  # the three best scores: 0.5, 0.9, 0.7
    buffer.add([0.2], [{"prompt_ids": torch.tensor([9])}])  # below the minimum: dropped
    assert sorted(int(d["prompt_ids"]) for _, d in buffer.heap) == [0, 2, 4]
    sampled = buffer.sample(2)
    assert len(sampled) == 2 and all(isinstance(s, dict) for s in sampled)
    assert len(buffer.sample(10)) == 10  # more than held: with replacement
    sampled = buffer.sample(num_samples=3)  # TRL's keyword
    assert len(sampled) == 3 and all(any(s is d for _, d in buffer.heap) for s in sampled)


def test_equal_scores_never_compare_the_data():
    buffer = ReplayBuffer(max_size=2)
    buffer.add([1.0, 1.0, 1.0], [{"a": 1}, {"a": 2}, {"a": 3}])  # TRL's heap of (score, dict) raises here
    assert len(buffer.heap) == 2


def test_sampling_follows_scores():
    buffer = ReplayBuffer(max_size=2)
    buffer.add([1.0, 9.0], ["low", "high"])
    draws = buffer.sample(2000)
    assert 0.85 < draws.count("high") / 2000 < 0.95


def test_state_round_trip_and_size_given_once():
    buffer = ReplayBuffer(max_size=2)
    buffer.add([1.0, 2.0], ["a", "b"])
    other = ReplayBuffer(max_size=2)
    other.load_state_dict(buffer.state_dict())
    assert other.heap == buffer.heap
    with pytest.raises(ValueError, match="once"):
        ReplayBuffer(2, max_size=2)
