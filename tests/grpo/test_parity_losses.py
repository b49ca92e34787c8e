"""Current-TRL loss options through train(): every loss_type, GSPO, delta, off-policy masking, bias-corrected KL,
entropy masking and the entropy bonus. A spy subclass records the objective the loss was actually built from."""

import copy

import pytest
import torch

from replayrl import GRPOConfig, GRPOTrainer
from tests.conftest import tiny_args


def varied_reward(completions, **kwargs):
    return [float(sum(map(ord, c)) % 7) for c in completions]


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


class Spy(GRPOTrainer):
    """Records every micro-batch objective of the real loss pass."""

    def _log_loss_metrics(self, mode, batch, logps, behaviour, entropy, objective):
        self.objectives = getattr(self, "objectives", []) + [objective]
        super()._log_loss_metrics(mode, batch, logps, behaviour, entropy, objective)


def run(model, tokenizer, dataset, tmp_path, reward=varied_reward, **overrides):
    args = tiny_args(GRPOConfig, tmp_path, **overrides)
    trainer = Spy(model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    moved = any(not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters()))
    return trainer, moved


@pytest.mark.parametrize(
    "loss_type,level",
    [("grpo", "token"), ("bnpo", "token"), ("dr_grpo", "token"), ("dapo", "sequence"), ("cispo", "token"),
     ("sapo", "token"), ("luspo", "sequence"), ("vespo", "token"), ("up", "token")],
)  # fmt: skip
def test_every_trl_loss_type_trains(model, tokenizer, dataset, tmp_path, loss_type, level):
    trainer, moved = run(
        model, tokenizer, dataset, tmp_path, loss_type=loss_type, importance_sampling_level=level, max_steps=1
    )
    assert moved
    assert torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))
    ratio = trainer.objectives[0].terms.ratio
    assert ratio.shape[1] == (1 if level == "sequence" else trainer.objectives[0].token_mask.shape[1])


def test_gspo_second_iteration_uses_one_ratio_per_sequence(model, tokenizer, dataset, tmp_path):
    trainer, _ = run(
        model, tokenizer, dataset, tmp_path, importance_sampling_level="sequence", num_iterations=2, max_steps=2,
        epsilon=1e-3, learning_rate=0.1,
    )  # fmt: skip
    second = trainer.objectives[1]  # same rows, after one optimizer step: the ratio moved
    assert second.terms.ratio.shape == (second.token_mask.shape[0], 1)
    assert not torch.allclose(second.terms.ratio, torch.ones_like(second.terms.ratio))
    flags = second.terms.high_clipped | second.terms.low_clipped
    rows = second.token_mask.any(1)
    # a clipped sequence is clipped on every token (one ratio per sequence)
    assert torch.equal(flags[rows].all(1), flags[rows].any(1))
    assert flags.any()


def test_delta_off_policy_mask_and_bias_corrected_kl(model, tokenizer, dataset, tmp_path):
    trainer, moved = run(
        model, tokenizer, dataset, tmp_path, num_iterations=2, max_steps=2, beta=0.1, delta=1.5,
        off_policy_mask_threshold=1e-6, use_bias_correction_kl=True, learning_rate=0.1, per_device_train_batch_size=8,
    )  # fmt: skip
    assert moved
    second = trainer.objectives[1]
    keep = second.off_policy_keep.squeeze(1)
    negative = trainer._micro_batches[0].advantages < 0
    assert keep[~negative].eq(1).all()  # positive advantages are never masked
    assert keep[negative].eq(0).any()  # stale sequences with A < 0 are dropped
    assert "off_policy_mask/kept_ratio" in trainer.state.log_history[1]


def test_top_entropy_quantile_trains_only_on_high_entropy_tokens(model, tokenizer, dataset, tmp_path):
    trainer, moved = run(model, tokenizer, dataset, tmp_path, top_entropy_quantile=0.25, max_steps=1)
    assert moved
    objective = trainer.objectives[0]
    kept = objective.entropy_mask[objective.token_mask].float().mean().item()
    assert 0 < kept <= 0.4
    assert trainer.state.log_history[0]["entropy_mask/kept_ratio"] == pytest.approx(kept)


def test_entropy_bonus_alone_raises_entropy(model, tokenizer, dataset, tmp_path):
    # constant rewards: zero advantages, no KL -> the entropy bonus is the only gradient
    initial = copy.deepcopy(model)
    trainer, moved = run(
        model, tokenizer, dataset, tmp_path, reward=constant_reward, beta=0.0, entropy_coef=1.0, max_steps=1,
        temperature=0.5,
    )  # fmt: skip
    assert moved and trainer.state.log_history[0]["entropy_coef"] == 1.0
    batch = trainer._micro_batches[0]  # the rows that step trained on
    mask = batch.completion_mask.bool()
    with torch.no_grad():
        before = trainer._token_logps(initial, batch, with_entropy=True)[1][mask].mean()
        after = trainer._token_logps(trainer.model, batch, with_entropy=True)[1][mask].mean()
    assert after > before


def test_no_bonus_and_no_signal_means_no_update(model, tokenizer, dataset, tmp_path):
    _, moved = run(model, tokenizer, dataset, tmp_path, reward=constant_reward, beta=0.0, max_steps=1,
                   optim="sgd")  # fmt: skip
    assert not moved


def test_adaptive_entropy_coef_steps_up_while_entropy_is_below_target(model, tokenizer, dataset, tmp_path):
    trainer, _ = run(
        model, tokenizer, dataset, tmp_path, use_adaptive_entropy=True, entropy_target=100.0, entropy_coef_delta=0.01,
        max_steps=3,
    )  # fmt: skip
    coefs = [h["entropy_coef"] for h in trainer.state.log_history if "entropy_coef" in h]
    assert coefs == pytest.approx([0.01, 0.02, 0.03])
