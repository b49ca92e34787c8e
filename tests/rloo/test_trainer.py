"""RLOOTrainer end to end on a tiny local Qwen2: learning, what it trained on, TRL's fields, invariances."""

import pytest
import torch

from replayrl import RLOOConfig, RLOOTrainer
from replayrl.algos.rloo import rloo_advantages
from replayrl.models.tiny import build_tiny_model, prompt_dataset
from tests.conftest import full_and_resumed_logs, loss_logs, tiny_args
from tests.trl_fields.parity import mismatches

EXACT = dict(bf16=False, gradient_checkpointing=False)  # TRL's defaults turn both on; exactness tests want fp32


def digits(completions, **kwargs):
    """Fraction of digits in the completion: ~0.05 for the random tiny model."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def varied_reward(completions, **kwargs):
    return [float(sum(map(ord, c)) % 7) for c in completions]


def make(tokenizer, tmp_path, reward=varied_reward, dataset=None, **overrides):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = tiny_args(RLOOConfig, tmp_path, **{**EXACT, **overrides})
    dataset = prompt_dataset(16) if dataset is None else dataset
    return RLOOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer)


def test_every_trl_field_with_trl_defaults():
    assert mismatches(RLOOConfig, "rloo") == []


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"loss_type": "dapo"}, "loss_type='dapo' is a GRPO option.*Leave loss_type at 'grpo'"),
        ({"scale_rewards": "batch"}, "scale_rewards"),
        ({"entropy_coef": 0.1}, "entropy_coef"),
        ({"reward_clip_range": [1.0, 0.0]}, "reward_clip_range must be"),
        ({"replay_buffer_size": 4, "replay_strategy": "mix"}, "replay_strategy='group'"),
    ],
)
def test_options_that_cannot_apply_are_refused_with_the_fix(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny_args(RLOOConfig, tmp_path, **overrides)


def test_learns_a_reward_through_train(tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path, reward=digits, per_device_train_batch_size=16, max_steps=25,
                   learning_rate=3e-2, beta=0.0)  # fmt: skip
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert sum(rewards[:3]) / 3 < 0.25 and sum(rewards[-3:]) / 3 > 0.7, rewards


def test_trains_on_leave_one_out_advantages_with_the_kl_in_the_reward(tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path, beta=0.5, reward_clip_range=[0.0, 5.0], max_steps=2)
    seen = []
    original = trainer.compute_loss

    def spy(model, inputs, *args, **kwargs):
        seen.append(inputs)
        return original(model, inputs, *args, **kwargs)

    trainer.compute_loss = spy
    trainer.train()
    assert trainer.ref_model is not None
    for batch in seen:
        mask = batch.completion_mask.bool()
        # old_logps: the first loss pass filled in the behaviour log-probs (on-policy)
        kl = torch.where(mask, batch.old_logps - batch.ref_logps, 0.0).sum(-1)
        expected = rloo_advantages(batch.rewards.clamp(0.0, 5.0) - 0.5 * kl, 4)
        torch.testing.assert_close(batch.advantages, expected, rtol=1e-4, atol=1e-5)
    assert any(float(b.rewards.max()) > 5.0 for b in seen)  # the clip did something
    assert any(h.get("kl", 0.0) != 0.0 for h in trainer.state.log_history)


def test_normalize_advantages(tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path, beta=0.0, normalize_advantages=True, max_steps=1)
    trainer.train()
    advantages = trainer._micro_batches[0].advantages
    assert abs(float(advantages.mean())) < 1e-5 and float(advantages.std()) == pytest.approx(1.0, abs=1e-3)


def test_gradient_accumulation_1x8_equals_8x1(tokenizer, tmp_path):
    results = {}
    for bs, ga in [(8, 1), (1, 8)]:
        trainer = make(tokenizer, tmp_path / f"{bs}", per_device_train_batch_size=bs, gradient_accumulation_steps=ga,
                       max_steps=1, optim="sgd", learning_rate=1.0, max_grad_norm=0.0, beta=0.1)  # fmt: skip
        trainer.train()
        results[bs] = ([p.detach().clone() for p in trainer.model.parameters()], trainer.state.log_history[0])
    (p8, log8), (p1, log1) = results[8], results[1]
    assert log1["loss"] == pytest.approx(log8["loss"], rel=1e-4, abs=1e-6)
    for a, b in zip(p1, p8):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("unit, steps", [("group", 3), ("rollout", 6)])  # rollouts: once G that beat their group
def test_replay_buffer_is_available(tokenizer, tmp_path, unit, steps):
    def flat_then_varied(completions, **kwargs):  # the second prompt of each batch: always zero-std
        return [0.0 if i >= 4 else r for i, r in enumerate(varied_reward(completions))]

    trainer = make(tokenizer, tmp_path, reward=flat_then_varied, per_device_train_batch_size=8, max_steps=steps,
                   beta=0.0, replay_buffer_size=4, replay_unit=unit)  # fmt: skip
    trainer.train()
    assert sum(h.get("replay/groups_replaced", 0) for h in trainer.state.log_history) > 0


def test_exact_resume_in_the_middle_of_a_generation_cycle(tokenizer, tmp_path):
    def run(out, stop=False, resume=None):
        trainer = make(tokenizer, tmp_path, output_dir=str(out), steps_per_generation=2, per_device_train_batch_size=2,
                       max_steps=4, save_strategy="steps", save_steps=1, beta=0.1)  # fmt: skip
        return loss_logs(trainer, stop, resume)

    pairs = full_and_resumed_logs(run, tmp_path)
    assert any("kl" in y for _, y in pairs)
    for x, y in pairs:
        assert {k for k in x if k in ("kl", "reward")} == {k for k in y if k in ("kl", "reward")}
        for k in {"loss", "grad_norm", "entropy"} | {k for k in x if k in ("kl", "reward")}:
            assert y[k] == pytest.approx(x[k], rel=1e-4, abs=1e-6), (x["step"], k)


def test_trl_defaults_train(tokenizer, tmp_path):
    """TRL's defaults as they are (bf16 autocast, gradient checkpointing, top_k=0) run on CPU."""
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = RLOOConfig(output_dir=str(tmp_path), max_steps=1, max_completion_length=4, per_device_train_batch_size=4,
                      report_to="none", use_cpu=True, save_strategy="no")  # fmt: skip
    assert args.bf16 and args.gradient_checkpointing and args.pad_to_multiple_of is None
    trainer = RLOOTrainer(model=model, reward_funcs=varied_reward, args=args, train_dataset=prompt_dataset(8),
                          processing_class=tokenizer)  # fmt: skip
    trainer.train()
    assert trainer.args.router_aux_loss_coef is None and trainer.router_aux_loss_coef == 0.0  # TRL: the model's
    assert trainer.state.log_history[0]["kl"] == pytest.approx(0.0, abs=1e-6)
