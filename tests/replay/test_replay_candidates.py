"""Replay candidates of issue 30 through `trainer.train()`, checking what reached the loss.

- fresh-anchored replay (`replay_placement="append"`, arXiv 2606.04560): every fresh row reaches the loss, buffered
  groups are added on top, one per zero-std group, and a resumed run is exact;
- M2PO's trust region on replayed rows (`replay_m2_threshold`, arXiv:2510.01161)."""

import pytest
import torch

from replayrl import GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from replayrl.algos import second_moment_trust_mask, zero_std_groups
from replayrl.models.tiny import build_tiny_model
from tests.conftest import tiny_args
from tests.replay.test_trainer import StopAt, task_reward


class Recorder(GRPOWithReplayBufferTrainer):
    """Records each fresh generation batch as scored, the batch built from it, and every micro-batch the loss sees."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.batches, self.seen = [], []

    def _postprocess_rollout(self, rollout):
        fresh = rollout.clone()
        out = super()._postprocess_rollout(rollout)
        self.batches.append((fresh, out, len(self.replay_buffer), self.state.global_step))
        return out

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self.seen.append(inputs.rows(slice(None)))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def make(tokenizer, dataset, tmp_path, cls=Recorder, **overrides):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    settings = dict(per_device_train_batch_size=8, max_steps=8, replay_buffer_size=8, learning_rate=5e-2, beta=0.0)
    settings.update({"replay_placement": "append", "replay_unit": "group", **overrides})
    args = tiny_args(GRPOWithReplayBufferConfig, tmp_path, **settings)
    return cls(model=model, reward_funcs=task_reward, args=args, train_dataset=dataset, processing_class=tokenizer)


def _same_rows(a, b) -> bool:
    fields = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "rewards", "advantages")
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields)


@pytest.mark.parametrize("overrides", [{}, dict(gradient_accumulation_steps=2, steps_per_generation=2)])
def test_fresh_rows_stay_and_a_buffered_group_is_added_per_zero_std_group(tokenizer, dataset, tmp_path, overrides):
    trainer = make(tokenizer, dataset, tmp_path, **overrides)
    trainer.train()
    G, spg = trainer.num_generations, trainer.args.steps_per_generation
    appended_total = 0
    for fresh, trained, buffer_size, step in trainer.batches:
        n = fresh.num_rows
        # the fresh batch is the head of the trained batch, untouched: nothing fresh is thrown away
        head = trained.rows(slice(0, n))
        assert _same_rows(head.trim(), fresh.trim()) and not head.replayed.any()
        n_zero = int(zero_std_groups(fresh.rewards, G).sum())
        added = (trained.num_rows - n) // G
        assert trained.num_rows == n + added * G and added <= n_zero
        if buffer_size >= n_zero and spg == 1:
            assert added == n_zero, "a zero-std group did not earn its buffered group although the buffer had one"
        tail = trained.rows(slice(n, None))
        assert tail.replayed.all()
        for g in range(added):  # whole informative groups, with their stored behaviour log-probs, from earlier steps
            rows = tail.rows(slice(g * G, (g + 1) * G))
            assert not zero_std_groups(rows.rewards, G).any() and rows.advantages.abs().sum() > 0
            assert torch.isfinite(rows.old_logps[rows.completion_mask.bool()]).all()
            assert (rows.policy_version < step).all()
        appended_total += added
    assert appended_total > 0
    # what the loss saw is exactly those batches, split into the configured micro-batches
    assert sum(b.num_rows for b in trainer.seen) == sum(t.num_rows for _, t, _, _ in trainer.batches)
    assert all(b.num_rows * spg == t.num_rows for b, (_, t, _, _) in zip(trainer.seen[::spg], trainer.batches))
    logs = [h for h in trainer.state.log_history if "replay/groups_replaced" in h]
    assert sum(h["replay/groups_replaced"] for h in logs) == appended_total  # one generation per step
    assert any(h["replay/frac_zero_std_trained"] > 0 for h in logs)  # zero-std fresh groups were trained, kept


@pytest.mark.parametrize("unit", ["group", "rollout"])
def test_resume_with_appended_groups_continues_exactly(tokenizer, dataset, tmp_path, unit):
    def run(out, stop_at=None, resume=None):
        trainer = make(
            tokenizer, dataset, tmp_path, cls=GRPOWithReplayBufferTrainer, output_dir=str(out), max_steps=6,
            save_strategy="steps", save_steps=3, beta=0.1, replay_unit=unit,
        )  # fmt: skip
        if stop_at:
            trainer.add_callback(StopAt(stop_at))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(tmp_path / "full")
    run(tmp_path / "part", stop_at=3)
    resumed = run(tmp_path / "part", resume=str(tmp_path / "part" / "checkpoint-3"))
    a = [h for h in full.state.log_history if "loss" in h and h["step"] > 3]
    b = [h for h in resumed.state.log_history if "loss" in h and h["step"] > 3]
    assert [h["step"] for h in a] == [h["step"] for h in b] == [4, 5, 6]
    appended = "replay/rollouts_appended" if unit == "rollout" else "replay/groups_replaced"
    assert sum(h[appended] for h in a) > 0  # the resumed steps did append buffered data
    for x, y in zip(a, b):
        for k in x:
            if "timing" not in k:
                assert y[k] == pytest.approx(x[k], rel=1e-4, abs=1e-6), (x["step"], k)
    stored = [[(g.uid, g.reuse) for g in t.replay_buffer.groups] for t in (full, resumed)]
    assert stored[0] == stored[1]


def test_append_is_the_default_and_a_bad_placement_is_refused(tmp_path):
    config = GRPOWithReplayBufferConfig(output_dir=str(tmp_path))
    assert (config.replay_placement, config.replay_unit) == ("append", "rollout")
    assert config.replay_rollout_priority == "positive_advantage"
    with pytest.raises(ValueError, match="replay_placement must be"):
        GRPOWithReplayBufferConfig(output_dir=str(tmp_path), replay_placement="concat")


class ObjectiveSpy(GRPOWithReplayBufferTrainer):
    """Records the importance weights and log-ratios of every training micro-batch's objective."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.inputs = []

    def _objective(self, x):
        if self.model.training:
            log_ratio = x.logps.detach() - x.behaviour
            self.inputs.append((x.batch.replayed.clone(), x.batch.loss_weights > 0, log_ratio, x.is_weights.clone()))
        return super()._objective(x)


def test_m2_threshold_masks_the_most_extreme_replayed_tokens_only(tokenizer, dataset, tmp_path):
    trainer = make(
        tokenizer, dataset, tmp_path, cls=ObjectiveSpy, replay_placement="replace", replay_m2_threshold=0.01,
        replay_importance_cap=None, max_steps=10,
    )  # fmt: skip
    trainer.train()
    masked = 0
    for replayed, real, log_ratio, weights in trainer.inputs:
        fresh = ~replayed.unsqueeze(1) & real
        assert (weights[fresh] == 1).all()  # fresh rows: the plain objective
        rows = replayed.unsqueeze(1) & real
        kept = second_moment_trust_mask(log_ratio, rows, 0.01)
        # kept replayed tokens carry the untruncated weight pi/mu, the dropped ones none; M2 of the kept within 0.01
        torch.testing.assert_close(weights[kept], log_ratio[kept].exp())
        assert (weights[rows & ~kept] == 0).all()
        assert not kept.any() or log_ratio[kept].pow(2).mean() <= 0.01 + 1e-6
        masked += int((rows & ~kept).sum())
    assert masked > 0 and any(r.any() for r, _, _, _ in trainer.inputs)
