"""DAPO dynamic sampling: the selection logic by hand, then through `train()` (with and without replay)."""

import pytest
import torch
from datasets import Dataset

from replayrl import GRPOConfig, GRPOTrainer, GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from replayrl.algos import zero_std_groups
from replayrl.grpo.dynamic_sampling import dynamic_sample, refill_prompts, select_groups
from replayrl.grpo.rollout import Rollout
from tests.conftest import tiny_args


def groups(rewards: list[list[float]], tag: int = 0) -> Rollout:
    flat = [r for g in rewards for r in g]
    n = len(flat)
    return Rollout(
        prompt_ids=torch.full((n, 2), tag),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.arange(n).unsqueeze(1),
        completion_mask=torch.ones(n, 1, dtype=torch.long),
        rewards=torch.tensor(flat),
        advantages=torch.zeros(n),
        policy_version=torch.zeros(n, dtype=torch.long),
        replayed=torch.zeros(n, dtype=torch.bool),
        truncated=torch.zeros(n, dtype=torch.bool),
    )


def test_select_groups_keeps_informative_groups_in_order():
    kept, flat = select_groups([groups([[0, 0], [0, 1]]), groups([[1, 0], [1, 1], [0, 2]], tag=1)], 2, 2, 1e-6)
    assert [g.rewards.tolist() for g in kept] == [[0, 1], [1, 0]]
    assert [g.rewards.tolist() for g in flat] == [[0, 0], [1, 1]]


def test_dynamic_sample_refills_until_full_and_counts():
    more = [groups([[0, 0], [3, 4]], tag=1), groups([[5, 6], [1, 1]], tag=2)]
    result = dynamic_sample(
        groups([[0, 0], [0, 1]]), lambda r: more[r - 1], lambda m: m > 0, 2, 5, "raise", 1e-6, pad_token_id=0
    )
    assert result.rollout.rewards.tolist() == [0, 1, 3, 4]
    assert (result.rounds, result.discarded, result.filled, result.generated) == (2, 2, 0, 8)


def test_dynamic_sample_fills_or_raises_when_the_rounds_run_out():
    flat = groups([[0, 0], [1, 1]])
    result = dynamic_sample(flat, lambda r: groups([[2, 2], [0, 3]]), lambda m: m > 0, 2, 2, "fill", 1e-6, 0)
    assert result.rollout.rewards.tolist() == [0, 3, 0, 0]  # informative first, then the first zero-std group
    assert (result.rounds, result.filled, result.discarded) == (2, 1, 2)
    with pytest.raises(ValueError, match="dynamic_sampling_max_rounds=2"):
        dynamic_sample(flat, lambda r: flat, lambda m: m > 0, 2, 2, "raise", 1e-6, 0)


def test_refill_prompts_is_deterministic_and_repeats_each_prompt_g_times():
    data = Dataset.from_dict({"prompt": [f"p{i}" for i in range(5)]})
    a = refill_prompts(data, 7, 3, seed=0, step=4, round_=1, rank=0)
    assert a == refill_prompts(data, 7, 3, seed=0, step=4, round_=1, rank=0)
    assert a != refill_prompts(data, 7, 3, seed=0, step=4, round_=2, rank=0)
    names = [r["prompt"] for r in a]
    assert len(names) == 21 and all(names[i] == names[i - i % 3] for i in range(21))
    assert set(names[:15:3]) == {f"p{i}" for i in range(5)}  # the first 5 draws cover the dataset once


def test_config_validation():
    with pytest.raises(ValueError, match="dynamic_sampling_max_rounds"):
        GRPOConfig(output_dir="x", dynamic_sampling=True, dynamic_sampling_max_rounds=0)
    with pytest.raises(ValueError, match="dynamic_sampling_on_exhausted"):
        GRPOConfig(output_dir="x", dynamic_sampling_on_exhausted="skip")


def half_flat_reward(completions, prompts, **kwargs):
    """Prompts starting with 'a' always score 0 (zero-std groups); the others score varied values."""
    return [0.0 if p.startswith("a") else float(sum(map(ord, c)) % 5) for c, p in zip(completions, prompts)]


DATA = Dataset.from_dict({"prompt": ["a1", "a2", "a3", "b1", "b2", "b3"]})


class Recording:
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self.seen.append(inputs.rows(slice(None)))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class RecordingGRPO(Recording, GRPOTrainer):
    seen: list


class RecordingReplay(Recording, GRPOWithReplayBufferTrainer):
    seen: list


def run(cls, config_cls, model, tokenizer, tmp_path, **overrides):
    settings = dict(per_device_train_batch_size=8, max_steps=3, beta=0.0, dynamic_sampling=True)
    settings.update(max_completion_length=4)
    args = tiny_args(config_cls, tmp_path, **{**settings, **overrides})
    trainer = cls(model=model, reward_funcs=half_flat_reward, args=args, train_dataset=DATA, processing_class=tokenizer)
    trainer.seen = []
    trainer.train()
    return trainer, [h for h in trainer.state.log_history if "loss" in h]


def test_dynamic_sampling_trains_only_on_groups_with_variance(model, tokenizer, tmp_path):
    trainer, logs = run(RecordingGRPO, GRPOConfig, model, tokenizer, tmp_path, dynamic_sampling_max_rounds=8)
    G = trainer.num_generations
    for batch in trainer.seen:
        assert batch.num_rows == 8 and not zero_std_groups(batch.rewards, G).any()
    assert any(h["dynamic_sampling/rounds"] > 1 for h in logs)
    for h in logs:
        assert h["dynamic_sampling/completions"] == 8 * h["dynamic_sampling/rounds"]
        assert h["dynamic_sampling/groups_discarded"] == 2 * h["dynamic_sampling/rounds"] - 2
        assert h["dynamic_sampling/groups_filled"] == 0


def test_exhausted_rounds_raise_or_leave_zero_std_groups_for_the_replay_buffer(model, tokenizer, tmp_path):
    always_flat = Dataset.from_dict({"prompt": ["a1", "a2"]})
    args = tiny_args(GRPOConfig, tmp_path, per_device_train_batch_size=8, dynamic_sampling=True, beta=0.0)
    args.dynamic_sampling_on_exhausted = "raise"
    trainer = GRPOTrainer(
        model=model, reward_funcs=half_flat_reward, args=args, train_dataset=always_flat, processing_class=tokenizer
    )
    with pytest.raises(ValueError, match="after dynamic_sampling_max_rounds=3 rounds"):
        trainer.train()
    # with replay and one round: the zero-std groups that fill the batch are swapped for buffered groups
    trainer, logs = run(RecordingReplay, GRPOWithReplayBufferConfig, model, tokenizer, tmp_path / "r", max_steps=6,
                        dynamic_sampling_max_rounds=1, replay_buffer_size=8)  # fmt: skip
    assert sum(h["dynamic_sampling/groups_filled"] for h in logs) > 0
    assert sum(h["replay/groups_replaced"] for h in logs) > 0
    assert any(b.replayed.any() for b in trainer.seen)
