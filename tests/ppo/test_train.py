"""PPOTrainer.train(): GRPO's reward functions, metrics, checkpoints, exact resume."""

import string

import pytest
import torch
from datasets import Dataset

from replayrl.checkpoints import CheckpointError, is_complete
from replayrl.metrics import read_metrics
from replayrl.models.tiny import build_tiny_model
from replayrl.models.value_head import AutoModelForCausalLMWithValueHead
from replayrl.ppo import PPOConfig, PPOTrainer


def lowercase_fraction(completions, answer, **kwargs):
    """Reward: fraction of lowercase letters; also proves extra dataset columns arrive (answer)."""
    assert len(answer) == len(completions)
    return [sum(c in string.ascii_lowercase for c in text) / max(len(text), 1) for text in completions]


def dataset(n=16):
    return Dataset.from_dict({"prompt": [f"q{i}:" for i in range(n)], "answer": [str(i) for i in range(n)]})


def trainer_for(tokenizer, out, steps, **overrides):
    lm = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    torch.manual_seed(0)  # the value head's init
    model = AutoModelForCausalLMWithValueHead.from_pretrained(lm)
    kwargs = dict(steps=8 * steps, batch_size=8, mini_batch_size=4, learning_rate=1e-2, init_kl_coef=0.05)
    kwargs.update(output_dir=str(out), **overrides)
    return PPOTrainer(PPOConfig(**kwargs), model, None, tokenizer, dataset=dataset())


def test_train_with_reward_functions(tokenizer, tmp_path):
    trainer = trainer_for(tokenizer, tmp_path / "run", steps=3)
    stats = trainer.train([lowercase_fraction], generation_kwargs={"max_new_tokens": 5})
    assert "rewards/lowercase_fraction/mean" in stats and "ppo/loss/total" in stats
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(0 <= r["reward"] <= 1 for r in records)
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(str(tmp_path / "run"))
    assert torch.equal(loaded.v_head.summary.weight, trainer.model.v_head.summary.weight)


def test_resume_equals_an_uninterrupted_run(tokenizer, tmp_path):
    gen = {"generation_kwargs": {"max_new_tokens": 5}}
    full = trainer_for(tokenizer, tmp_path / "full", steps=4, adap_kl_ctrl=True, use_score_scaling=True)
    full.train([lowercase_fraction], **gen)
    first = trainer_for(tokenizer, tmp_path / "split", steps=2, save_steps=2, adap_kl_ctrl=True, use_score_scaling=True)
    first.train([lowercase_fraction], **gen)
    assert is_complete(tmp_path / "split" / "checkpoint-2")
    with (tmp_path / "split" / "metrics.jsonl").open("a") as f:  # a step logged after the checkpoint, then a crash
        f.write('{"step": 3, "reward": 0.5}\n')
    resumed = trainer_for(tokenizer, tmp_path / "split", steps=4, adap_kl_ctrl=True, use_score_scaling=True)
    resumed.train([lowercase_fraction], resume_from_checkpoint=True, **gen)
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    assert resumed.kl_ctl.value == full.kl_ctl.value and resumed.running.mean == full.running.mean
    whole, split = read_metrics(tmp_path / "full" / "metrics.jsonl"), read_metrics(tmp_path / "split" / "metrics.jsonl")
    assert [r["step"] for r in split] == [1, 2, 3, 4]
    for a, b in zip(whole, split):
        assert a["ppo/loss/total"] == b["ppo/loss/total"] and a["reward"] == b["reward"]


def test_train_errors(tokenizer, tmp_path):
    trainer = trainer_for(tokenizer, tmp_path / "x", steps=1)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        trainer.train([lowercase_fraction], resume_from_checkpoint=True)
    with pytest.raises(ValueError, match="'question' column"):
        trainer.train([lowercase_fraction], prompt_column="question")
    with pytest.raises(ValueError, match="config.temperature"):
        trainer.train([lowercase_fraction], generation_kwargs={"temperature": 0.7})
    no_data = PPOTrainer(PPOConfig(batch_size=8), trainer.model, None, tokenizer)
    with pytest.raises(ValueError, match="needs a dataset"):
        no_data.train([lowercase_fraction])
    stale = trainer_for(tokenizer, tmp_path / "stale", steps=1, save_steps=1)
    stale.train([lowercase_fraction], generation_kwargs={"max_new_tokens": 2})
    again = trainer_for(tokenizer, tmp_path / "stale", steps=1, save_steps=1)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        again.train([lowercase_fraction])
