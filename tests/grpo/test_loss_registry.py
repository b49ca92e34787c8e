"""Adding a GRPO loss type is one entry of `algos.GRPO_LOSSES`: with nothing else edited, GRPOConfig accepts the
name and train() uses the entry's per-token loss and its aggregation (the global token count included)."""

import dataclasses
import logging

import pytest
import torch

from replayrl import GRPOConfig, GRPOTrainer, algos
from replayrl.algos import losses
from replayrl.algos.policy_losses import ppo_clip_loss
from replayrl.models.tiny import build_tiny_model, prompt_dataset
from tests.conftest import tiny_args


def varied_reward(completions, **kwargs):
    return [float(sum(map(ord, c)) % 7) for c in completions]


def doubled_ppo_clip(logps, old_logps, advantages, mask, level, params):
    out = ppo_clip_loss(logps, old_logps, advantages, mask, level, params)
    return dataclasses.replace(out, per_token_loss=2 * out.per_token_loss)


def sgd_update(tokenizer, tmp_path, loss_type: str) -> tuple[dict, list[torch.Tensor]]:
    """The log and the parameter change of one plain SGD step (lr 1, no clipping) with `loss_type`, from the same
    model and data."""
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = tiny_args(GRPOConfig, tmp_path / loss_type, loss_type=loss_type, max_steps=1, optim="sgd",
                     learning_rate=1.0, max_grad_norm=0.0, beta=0.0)  # fmt: skip
    trainer = GRPOTrainer(model=model, reward_funcs=varied_reward, args=args, train_dataset=prompt_dataset(16),
                          processing_class=tokenizer)  # fmt: skip
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    return trainer.state.log_history[0], [p.detach() - b for p, b in zip(trainer.model.parameters(), before)]


def test_a_new_registry_entry_alone_trains_through_train(tokenizer, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="loss_type must be one of"):
        tiny_args(GRPOConfig, tmp_path, loss_type="dapo_x2")
    entry = losses.GRPOLoss(doubled_ppo_clip, losses.GLOBAL_TOKEN_MEAN, "a test: DAPO's loss times two")
    monkeypatch.setitem(losses.GRPO_LOSSES, "dapo_x2", entry)
    dapo_log, dapo = sgd_update(tokenizer, tmp_path, "dapo")
    doubled_log, doubled = sgd_update(tokenizer, tmp_path, "dapo_x2")
    assert abs(dapo_log["loss"]) > 0.01 and doubled_log["loss"] == pytest.approx(2 * dapo_log["loss"], rel=1e-5)
    for a, b in zip(doubled, dapo):
        torch.testing.assert_close(a, 2 * b, rtol=1e-4, atol=1e-5)


def test_trl_warning_for_sequence_level_ratios_follows_the_aggregation(tmp_path, caplog):
    """TRL 1.16 warns for exactly these four: they sum token terms, so a sequence weighs by its length."""
    assert set(algos.LENGTH_WEIGHTED_LOSSES) == {"bnpo", "dr_grpo", "dapo", "cispo"}
    for loss_type in ("dapo", "grpo"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="replayrl.grpo.config"):
            tiny_args(GRPOConfig, tmp_path, loss_type=loss_type, importance_sampling_level="sequence")
        assert ("weights each sequence by its completion length" in caplog.text) == (loss_type == "dapo")
