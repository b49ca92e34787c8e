"""TRL v0.7.1's PPOTrainer methods: `_kl_penalty`, `compute_rewards`, `compute_advantages`, `loss`
with hand-computed values, and `step` going through them (an override changes the update)."""

import math

import pytest
import torch

from replayrl.ppo import PPOConfig, PPOTrainer
from tests.algos.test_ppo import LOGP, REF
from tests.ppo.test_trainer import GEN, make_trainer, queries_of, value_model

KL_SANITY = [
    ("kl", [[0.1, -0.1, 0.1], [-0.1, 0.1, -0.2]]),
    ("abs", [[0.1, 0.1, 0.1], [0.1, 0.1, 0.2]]),
    ("mse", [[0.005, 0.005, 0.005], [0.005, 0.005, 0.02]]),
]  # docs' sanity values, through the trainer's method this time (tests/algos/test_ppo.py: the function)


@pytest.mark.parametrize("kind, expected", KL_SANITY)
def test_kl_penalty_values(tokenizer, kind, expected):
    trainer = make_trainer(tokenizer, kl_penalty=kind)
    assert torch.allclose(trainer._kl_penalty(LOGP, REF), torch.tensor(expected), atol=1e-6)


def test_kl_penalty_full_is_the_kl_over_the_vocabulary(tokenizer):
    trainer = make_trainer(tokenizer, kl_penalty="full")
    p, q = torch.tensor([[[0.5, 0.5]]]), torch.tensor([[[0.25, 0.75]]])
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert trainer._kl_penalty(p.log(), q.log()).item() == pytest.approx(expected, abs=1e-6)


def test_compute_rewards_hand_values(tokenizer):
    trainer = make_trainer(tokenizer, init_kl_coef=0.2)
    masks = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards, non_score = trainer.compute_rewards(torch.tensor([1.0, -0.5]), LOGP, REF, masks)
    # -0.2 * KL on every response token, the score added on the last one
    assert torch.allclose(non_score, torch.tensor([[-0.02, 0.02, -0.02], [0.02, -0.02, 0.0]]), atol=1e-6)
    assert torch.allclose(rewards, torch.tensor([[-0.02, 0.02, 0.98], [0.02, -0.52, 0.0]]), atol=1e-6)


def test_compute_advantages_hand_values(tokenizer):
    trainer = make_trainer(tokenizer, gamma=1.0, lam=0.95)
    values, rewards = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[0.0, 0.0, 1.0]])
    masked_values, advantages, returns = trainer.compute_advantages(values, rewards, torch.ones(1, 3))
    # deltas (r_t + V_{t+1} - V_t) = [1, 1, -2]; A_2 = -2, A_1 = 1 - 0.95 * 2, A_0 = 1 + 0.95 * A_1
    raw = torch.tensor([[0.145, -0.9, -2.0]])
    assert torch.allclose(masked_values, values)
    assert torch.allclose(returns, raw + values, atol=1e-6)  # [1.145, 1.1, 1.0]
    whitened = (raw - raw.mean()) / torch.sqrt(raw.var(unbiased=True) + 1e-8)
    assert torch.allclose(advantages, whitened, atol=1e-5)


def test_loss_hand_values(tokenizer):
    trainer = make_trainer(tokenizer, cliprange=0.2, cliprange_value=0.2, vf_coef=0.1)
    mask = torch.ones(1, 2)
    old, logprobs = torch.zeros(1, 2), torch.tensor([[math.log(1.5), math.log(0.5)]])  # ratios 1.5, 0.5
    advantages = torch.tensor([[1.0, -1.0]])
    values, vpreds, returns = torch.zeros(1, 2), torch.tensor([[0.5, 1.0]]), torch.ones(1, 2)
    logits = torch.zeros(1, 2, 4)  # uniform over 4 tokens
    pg_loss, vf_loss, stats = trainer.loss(old, values, logits, vpreds, logprobs, mask, advantages, returns)
    # policy: max(-A r, -A clip(r, 0.8, 1.2)) = max(-1.5, -1.2), max(0.5, 0.8) -> mean(-1.2, 0.8) = -0.2
    assert pg_loss.item() == pytest.approx(-0.2, abs=1e-6)
    # value: clip(V, 0 +- 0.2) = 0.2; max((V-R)^2, (0.2-R)^2) = 0.64 both -> 0.1 * 0.5 * 0.64
    assert vf_loss.item() == pytest.approx(0.032, abs=1e-6)
    assert stats["policy/clipfrac"] == 1.0 and stats["val/clipfrac"] == 1.0
    assert stats["policy/entropy"] == pytest.approx(math.log(4), abs=1e-6)
    assert stats["loss/total"] == pytest.approx(-0.168, abs=1e-6)


class ZeroLoss(PPOTrainer):
    calls = 0

    def loss(self, old_logprobs, values, logits, vpreds, logprobs, mask, advantages, returns):
        type(self).calls += 1
        pg_loss, vf_loss, stats = super().loss(
            old_logprobs, values, logits, vpreds, logprobs, mask, advantages, returns
        )
        return pg_loss * 0.0, vf_loss * 0.0, stats


class ConstantKL(PPOTrainer):
    def _kl_penalty(self, logprob, ref_logprob):
        return torch.ones_like(logprob)


class RecordAdvantages(PPOTrainer):
    seen = None

    def compute_advantages(self, values, rewards, mask):
        type(self).seen = rewards.clone(), mask.clone()
        values, advantages, returns = super().compute_advantages(values, rewards, mask)
        return values, advantages * 0.0, returns * 0.0 + values


def _subclass(cls, tokenizer, **overrides):
    kwargs = dict(batch_size=8, mini_batch_size=4, learning_rate=1e-2, init_kl_coef=0.2, adap_kl_ctrl=False)
    return cls(PPOConfig(**kwargs, **overrides), value_model(tokenizer), None, tokenizer)


def _step(trainer, tokenizer):
    queries = queries_of(tokenizer)
    responses = trainer.generate(queries, return_prompt=False, **GEN)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    stats = trainer.step(queries, responses, [float(i) for i in range(8)])
    moved = any(not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters()))
    return stats, responses, moved


def test_step_goes_through_loss(tokenizer):
    ZeroLoss.calls = 0
    stats, _, moved = _step(_subclass(ZeroLoss, tokenizer, ppo_epochs=1), tokenizer)
    assert ZeroLoss.calls == 2  # 8 samples / mini_batch_size 4, one epoch
    assert not moved  # zero loss: zero gradients, Adam does not move
    _, _, moved = _step(make_trainer(tokenizer, ppo_epochs=1), tokenizer)
    assert moved


def test_step_goes_through_kl_penalty_and_compute_rewards(tokenizer):
    stats, responses, _ = _step(_subclass(ConstantKL, tokenizer, ppo_epochs=1), tokenizer)
    mean_len = sum(len(r) for r in responses) / len(responses)
    # KL 1 on every response token: non-score reward -0.2 per token, objective/kl = tokens per response
    assert stats["ppo/mean_non_score_reward"] == pytest.approx(-0.2 * mean_len, abs=1e-5)
    assert stats["objective/kl"] == pytest.approx(mean_len, abs=1e-5)


def test_step_goes_through_compute_advantages(tokenizer):
    stats, _, moved = _step(_subclass(RecordAdvantages, tokenizer, ppo_epochs=1), tokenizer)
    rewards, mask = RecordAdvantages.seen
    assert rewards.shape == mask.shape and rewards.shape[0] == 8
    # the score (0..7) sits on each row's last response token (KL is 0 at the first step: policy == reference)
    last = mask.shape[1] - 1 - mask.flip(1).argmax(1)
    assert torch.allclose(rewards[torch.arange(8), last], torch.arange(8.0), atol=1e-5)
    assert stats["ppo/policy/advantages_mean"] == 0.0 and stats["ppo/returns/mean"] == stats["ppo/val/mean"]
