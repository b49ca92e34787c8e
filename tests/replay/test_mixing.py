"""ExGRPO-style mixing and the replay diagnostics: pure functions with hand-computed values, then `train()`."""

import math

import pytest
import torch
from datasets import Dataset

from replayrl import GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from replayrl.grpo.rollout import Rollout
from replayrl.replay.diagnostics import clipped_without_gradient
from replayrl.replay.mixing import SuccessStore, mix_into_group, prompt_key, successes_of_group
from tests.conftest import tiny_args


def rollout(rewards, advantages, widths=(2, 3), prompt=(5, 6)):
    n = len(rewards)
    p, c = widths
    return Rollout(
        prompt_ids=torch.tensor([[0] * (p - len(prompt)) + list(prompt)] * n),
        prompt_mask=torch.tensor([[0] * (p - len(prompt)) + [1] * len(prompt)] * n),
        completion_ids=torch.arange(n * c).reshape(n, c),
        completion_mask=torch.ones(n, c, dtype=torch.long),
        rewards=torch.tensor(rewards, dtype=torch.float),
        advantages=torch.tensor(advantages, dtype=torch.float),
        policy_version=torch.zeros(n, dtype=torch.long),
        replayed=torch.zeros(n, dtype=torch.bool),
        truncated=torch.zeros(n, dtype=torch.bool),
        old_logps=torch.full((n, c), -1.0),
    )


def test_prompt_key_ignores_padding():
    assert prompt_key(torch.tensor([0, 0, 7, 8]), torch.tensor([0, 0, 1, 1])) == (7, 8)


def test_mix_into_group_recomputes_advantages_by_hand():
    fresh = rollout([0.0, 0.0, 0.0, 0.0], [0.0] * 4)
    stored = rollout([1.0], [1.5], widths=(2, 4))
    mixed = mix_into_group(fresh, stored, "group", pad_token_id=0)
    assert mixed.rewards.tolist() == [0.0, 0.0, 0.0, 1.0]
    assert mixed.replayed.tolist() == [False, False, False, True]
    # mean 0.25, unbiased std sqrt(0.25) = 0.5: (0 - 0.25) / 0.5 = -0.5, (1 - 0.25) / 0.5 = 1.5 (eps 1e-4)
    assert mixed.advantages.tolist() == pytest.approx([-0.5, -0.5, -0.5, 1.5], abs=1e-3)
    assert mixed.completion_ids.shape == (4, 4)  # re-padded to the wider stored completion
    assert torch.isnan(mixed.old_logps[0, 3]) and mixed.old_logps[3].tolist() == [-1.0] * 4
    unscaled = mix_into_group(fresh, stored, "none", pad_token_id=0)
    assert unscaled.advantages.tolist() == pytest.approx([-0.25, -0.25, -0.25, 0.75])


def test_successes_of_group_picks_the_best_row_only_with_variance():
    assert successes_of_group(rollout([0.0, 1.0, 0.5], [-0.9, 1.1, -0.2])) == 1
    assert successes_of_group(rollout([1.0, 1.0], [0.0, 0.0])) is None


def test_success_store_age_reuse_capacity_and_state():
    store = SuccessStore(capacity=2, max_age=3, max_reuse=2)
    row = rollout([1.0], [1.0])
    store.add((1,), row, version=0)
    store.add((2,), row, version=5)
    store.add((3,), row, version=5)  # evicts (1,): least recently stored
    assert list(store.entries) == [(2,), (3,)]
    assert store.peek((2,), current_version=9) is None and list(store.entries) == [(3,)]  # 4 steps old > 3
    assert store.take((3,), 6).reuse == 1
    assert store.take((3,), 6).reuse == 2 and len(store) == 0  # max_reuse reached: gone
    store.add((4,), row, version=1)
    copy = SuccessStore(capacity=9)
    copy.load_state_dict(store.state_dict())
    assert copy.capacity == 2 and list(copy.entries) == [(4,)] and copy.entries[(4,)].version == 1


def test_clipped_without_gradient_by_hand():
    log_ratio = torch.log(torch.tensor([[1.3, 0.7, 1.1], [1.3, 0.7, 1.1]]))
    advantages = torch.tensor([1.0, -1.0])
    # A > 0: only ratio > 1.2 is clipped; A < 0: only ratio < 0.8
    expected = [[True, False, False], [False, True, False]]
    assert clipped_without_gradient(log_ratio, advantages, 0.2, 0.2).tolist() == expected


class FlakyReward:
    """Per prompt: on even visits the first completion of the group scores 1 (an informative group, whose
    success is stored), on odd visits every completion scores 0 (an all-failed group that mixing fixes)."""

    def __init__(self):
        self.visits = {}

    def __call__(self, completions, prompts, **kwargs):
        scores, first = [], set()
        for p in prompts:
            new = p not in first
            first.add(p)
            scores.append(float(new and self.visits.get(p, 0) % 2 == 0))
        for p in first:
            self.visits[p] = self.visits.get(p, 0) + 1
        return scores


class Recording(GRPOWithReplayBufferTrainer):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self.seen.append(inputs.rows(slice(None)))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


@pytest.mark.parametrize("strategy", ["mix", "mix_then_group"])
def test_mix_puts_a_stored_success_into_its_own_prompts_failed_group(model, tokenizer, tmp_path, strategy):
    data = Dataset.from_dict({"prompt": ["ab", "cd"]})
    args = tiny_args(
        GRPOWithReplayBufferConfig,
        tmp_path,
        per_device_train_batch_size=8,
        max_steps=6,
        beta=0.0,
        replay_strategy=strategy,
        replay_importance_cap=2.0,
    )
    trainer = Recording(
        model=model, reward_funcs=FlakyReward(), args=args, train_dataset=data, processing_class=tokenizer
    )
    trainer.train()
    G, mixed_groups = trainer.num_generations, 0
    stored_completions = set()
    for batch in trainer.seen:
        for g in range(batch.num_rows // G):
            rows = slice(g * G, (g + 1) * G)
            group = batch.rows(rows)
            keys = {prompt_key(i, m) for i, m in zip(group.prompt_ids, group.prompt_mask)}
            assert len(keys) == 1, "a group holds one prompt"
            if group.replayed.sum() == 1:  # mixed: G-1 fresh failures + the stored success, last
                mixed_groups += 1
                assert group.replayed[-1] and group.rewards.tolist() == [0.0] * (G - 1) + [1.0]
                assert group.advantages[-1] > 0 and (group.advantages[:-1] < 0).all()
                ids = group.completion_ids[-1][group.completion_mask[-1].bool()]
                assert tuple(ids.tolist()) in stored_completions  # trained fresh in an earlier step
                assert torch.isfinite(group.old_logps[-1][group.completion_mask[-1].bool()]).all()
            elif not group.replayed.any() and group.rewards.max() > 0:
                best = int(group.rewards.argmax())
                stored_completions.add(tuple(group.completion_ids[best][group.completion_mask[best].bool()].tolist()))
    assert mixed_groups >= 4
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert sum(h["replay/rows_mixed"] for h in logs) == mixed_groups
    assert all(math.isfinite(h["loss"]) for h in logs)
    if strategy == "mix":
        assert all(h["replay/frac_zero_std_trained"] == 0.0 for h in logs[1:])


def test_resume_with_mix_and_dynamic_sampling_matches_the_uninterrupted_run(tokenizer, tmp_path):
    from replayrl.models.tiny import build_tiny_model
    from tests.replay.test_trainer import StopAt

    def reward(completions, prompts, **kwargs):  # sparse-ish, stateless: some groups flat, some not
        return [float(sum(map(ord, c)) % 4 == 0) for c in completions]

    def run(out, stop_at=None, resume=None):
        model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
        args = tiny_args(
            GRPOWithReplayBufferConfig,
            tmp_path,
            output_dir=str(out),
            per_device_train_batch_size=8,
            max_steps=4,
            save_strategy="steps",
            save_steps=2,
            beta=0.0,
            replay_strategy="mix_then_group",
            dynamic_sampling=True,
            dynamic_sampling_max_rounds=2,
        )
        data = Dataset.from_dict({"prompt": ["ab", "cd", "ef", "gh"]})
        trainer = GRPOWithReplayBufferTrainer(
            model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer
        )
        if stop_at:
            trainer.add_callback(StopAt(stop_at))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(tmp_path / "full")
    run(tmp_path / "part", stop_at=2)
    resumed = run(tmp_path / "part", resume=str(tmp_path / "part" / "checkpoint-2"))
    a = [h for h in full.state.log_history if "loss" in h and h["step"] > 2]
    b = [h for h in resumed.state.log_history if "loss" in h and h["step"] > 2]
    assert [h["step"] for h in a] == [h["step"] for h in b] == [3, 4]
    for x, y in zip(a, b):
        for k in x:
            if "timing" not in k:
                assert y[k] == pytest.approx(x[k], rel=1e-4, abs=1e-6), (x["step"], k)
    assert list(full.success_store.entries) == list(resumed.success_store.entries)
    assert any(h["dynamic_sampling/rounds"] > 1 for h in full.state.log_history if "loss" in h)  # extra rounds ran
