"""Policy losses of every loss_type, importance-sampling levels, KL correction, off-policy masking: hand values."""

import math

import pytest
import torch

from replayrl import algos
from replayrl.algos import PolicyLossParams, grpo_policy_loss

P = PolicyLossParams(epsilon_low=0.2, epsilon_high=0.2)


def _logps(*log_ratios):
    """One row: old log-probs 0 so that logps are the log-ratios."""
    logps = torch.tensor([list(log_ratios)], dtype=torch.float64, requires_grad=True)
    return logps, torch.zeros_like(logps)


def test_sequence_level_is_the_exp_of_the_masked_mean_log_ratio():
    logps = torch.tensor([[0.2, -0.4, 9.0], [0.1, 0.1, 0.1]])
    old = torch.zeros_like(logps)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    seq = algos.importance_log_weights(logps, old, mask, "sequence")
    assert seq.shape == (2, 1)
    assert torch.allclose(seq.squeeze(1), torch.tensor([-0.1, 0.1]))
    assert torch.equal(algos.importance_log_weights(logps, old, mask, "token"), logps)
    with pytest.raises(ValueError, match="'word'"):
        algos.importance_log_weights(logps, old, mask, "word")


def test_gspo_clips_the_whole_sequence_where_token_level_clips_one_token():
    # token log-ratios 0.5 and -0.5: token level clips the first token (A > 0), sequence ratio is exp(0) = 1.
    logps, old = _logps(0.5, -0.5)
    adv, mask = torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 2)
    tok = grpo_policy_loss("grpo", logps, old, adv, mask, "token", P)
    seq = grpo_policy_loss("grpo", logps, old, adv, mask, "sequence", P)
    assert tok.high_clipped.tolist() == [[True, False]]
    assert torch.allclose(tok.per_token_loss, -torch.tensor([[1.2, math.exp(-0.5)]], dtype=torch.float64))
    assert not seq.high_clipped.any()
    assert torch.allclose(seq.per_token_loss, -torch.ones(1, 2, dtype=torch.float64))
    # gradient of the sequence ratio is spread over the tokens: d/dlogp_t exp(mean) = exp(mean) / T
    seq.per_token_loss[0, 0].backward()
    assert torch.allclose(logps.grad, torch.tensor([[-0.5, -0.5]], dtype=torch.float64))


def test_delta_caps_the_unclipped_ratio_for_negative_advantages():
    logps, old = _logps(math.log(3.0))
    adv = torch.tensor([-1.0], dtype=torch.float64)
    plain = grpo_policy_loss("dapo", logps, old, adv, torch.ones(1, 1), "token", P)
    capped = grpo_policy_loss("dapo", logps, old, adv, torch.ones(1, 1), "token", PolicyLossParams(0.2, 0.2, delta=2.0))
    assert plain.per_token_loss.item() == pytest.approx(3.0)  # -min(3 * -1, 1.2 * -1) = 3
    assert capped.per_token_loss.item() == pytest.approx(2.0)  # min(r, delta) = 2


def test_cispo_is_reinforce_with_a_clipped_detached_weight():
    logps, old = _logps(math.log(2.0), math.log(0.5))
    adv = torch.tensor([1.0], dtype=torch.float64)
    out = grpo_policy_loss("cispo", logps, old, adv, torch.ones(1, 2), "token", PolicyLossParams(0.2, 1.5))
    expected = -torch.tensor([[1.5 * math.log(2.0), 0.5 * math.log(0.5)]], dtype=torch.float64)
    assert torch.allclose(out.per_token_loss, expected)
    out.per_token_loss.sum().backward()
    assert torch.allclose(logps.grad, -torch.tensor([[1.5, 0.5]], dtype=torch.float64))  # no token loses its gradient
    assert out.high_clipped.tolist() == [[True, False]]


def test_sapo_gate_and_asymmetric_temperatures():
    assert algos.sapo_gate(torch.tensor(1.0), 2.0).item() == pytest.approx(1.0)  # 4/tau * sigmoid(0)
    logps, old = _logps(math.log(1.5))
    p = PolicyLossParams(sapo_temperature_pos=1.0, sapo_temperature_neg=2.0)
    pos = grpo_policy_loss("sapo", logps, old, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1), "token", p)
    neg = grpo_policy_loss("sapo", logps, old, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 1), "token", p)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert pos.per_token_loss.item() == pytest.approx(-4 * sig(0.5))
    assert neg.per_token_loss.item() == pytest.approx(4 / 2 * sig(2 * 0.5))


def test_up_is_unclipped_reinforce_for_positive_advantages_and_the_clip_otherwise():
    # Token 0: ratio 2 (far above 1 + eps); token 1: ratio 0.5. Row 0 has A = +1.5, row 1 A = -1.
    logps = torch.tensor([[math.log(2.0), math.log(0.5)]] * 2, dtype=torch.float64, requires_grad=True)
    old, adv = torch.zeros_like(logps), torch.tensor([1.5, -1.0], dtype=torch.float64)
    out = grpo_policy_loss("up", logps, old, adv, torch.ones(2, 2), "token", P)
    clip = grpo_policy_loss("grpo", logps, old, adv, torch.ones(2, 2), "token", P)
    assert torch.allclose(out.per_token_loss[0], torch.tensor([-1.5, -1.5], dtype=torch.float64))  # r~ = 1 in value
    assert torch.allclose(out.per_token_loss[1], clip.per_token_loss[1])  # A <= 0: PPO's clipped surrogate
    out.per_token_loss.sum().backward()
    # A > 0: d/dlogp of -exp(logp - sg(logp)) * A is -A on every token, the clipped ratio 2 included (no upper clip)
    assert torch.allclose(logps.grad[0], torch.tensor([-1.5, -1.5], dtype=torch.float64))
    # A < 0: ratio 0.5 < 1 - eps is clipped (no gradient); ratio 2 keeps -r * A, gradient -r * A = 2
    assert torch.allclose(logps.grad[1], torch.tensor([2.0, 0.0], dtype=torch.float64))
    assert out.high_clipped.eq(False).all() and out.low_clipped.tolist() == [[False, False], [False, True]]
    assert torch.allclose(out.ratio, clip.ratio)
    assert torch.allclose(algos.token_weights(torch.ones(2, 2), "up", 2, 8.0), torch.full((2, 2), 1 / 8))  # as DAPO
    with pytest.raises(ValueError, match="self-anchors it: set importance_sampling_level='token'"):
        algos.check_loss_options("up", "sequence", None)
    algos.check_loss_options("up", "token", 2.0)  # delta caps the clipped branch's unclipped ratio, as for grpo


def test_vespo_weight_is_one_at_ratio_one_and_decays_off_policy():
    p = PolicyLossParams()
    mask = torch.ones(2, 2)
    log_ratio = torch.tensor([[0.0, 0.0], [0.5, 0.5]])
    phi = algos.vespo_weights(log_ratio, torch.tensor([1.0, 1.0]), mask, p)
    assert phi[0].item() == pytest.approx(1.0)
    w = math.e  # product of the ratios
    assert phi[1].item() == pytest.approx(math.exp(3.0 + 2.0 * 1.0 - 3.0 * w), rel=1e-5)
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    out = grpo_policy_loss("vespo", logps, logps.detach(), torch.tensor([2.0]), torch.ones(1, 2), "token", p)
    assert torch.allclose(out.per_token_loss, torch.tensor([[2.0, 4.0]]))


def test_registry_holds_every_trl_loss_type():
    trl_116 = {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"}
    assert set(algos.GRPO_LOSSES) == trl_116 | {"up"}  # UP: newer than TRL 1.16 (TRL issue #6407)
    with pytest.raises(ValueError, match="'ppo'"):
        grpo_policy_loss("ppo", *_logps(0.0), torch.ones(1), torch.ones(1, 1), "token", P)


def test_token_weights_of_the_new_loss_types():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert torch.allclose(algos.token_weights(mask, "luspo", 3), mask / 2)  # sum over tokens, mean over rows
    assert torch.allclose(algos.token_weights(mask, "sapo", 3), algos.token_weights(mask, "grpo", 3))
    assert torch.allclose(algos.token_weights(mask, "cispo", 3, 6.0), mask / 6.0)


def test_importance_corrected_kl_and_off_policy_mask():
    kl = torch.tensor([[0.1, 0.2]])
    logps = torch.tensor([[math.log(2.0), 0.0]])
    corrected = algos.importance_corrected_kl(kl, logps, torch.zeros(1, 2), torch.ones(1, 2), "token")
    assert torch.allclose(corrected, torch.tensor([[0.2, 0.2]]))
    # sequence 0: A < 0 and mean(behaviour - logp) = 1.0 > 0.5 -> dropped; 1: A >= 0 -> kept; 2: low KL -> kept
    behaviour = torch.tensor([[1.0, 1.0], [5.0, 5.0], [0.2, 0.2]])
    out = algos.off_policy_sequence_mask(
        torch.tensor([-1.0, 1.0, -1.0]), torch.zeros(3, 2), behaviour, torch.ones(3, 2), 0.5
    )
    assert out.squeeze(1).tolist() == [0.0, 1.0, 1.0]


def test_off_policy_mask_shapes_padding_and_nan():
    # advantages (B, 1) as TRL passes them; padding (mask 0) never counts, whatever its log-probs
    logps = torch.tensor([[-2.0, -2.0, -1e4, 1e4]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    drop = algos.off_policy_sequence_mask(torch.tensor([[-1.0]]), logps, torch.zeros(1, 4), mask, 1.0)
    assert drop.tolist() == [[0.0]]  # mean KL (2 + 2) / 2 = 2 > 1
    keep = algos.off_policy_sequence_mask(torch.tensor([[-1.0]]), logps / 4, torch.zeros(1, 4), mask, 1.0)
    assert keep.tolist() == [[1.0]]  # mean KL 0.5 <= 1
    # a NaN behaviour log-prob counts as zero KL: (2 + 0) / 2 = 1 <= 1 -> kept
    behaviour = torch.tensor([[0.0, float("nan"), 0.0, 0.0]])
    assert algos.off_policy_sequence_mask(torch.tensor([-1.0]), logps, behaviour, mask, 1.0).tolist() == [[1.0]]
    # a bool mask gives a float result (it multiplies the per-token loss)
    assert algos.off_policy_sequence_mask(torch.tensor([1.0]), logps, logps, mask.bool(), 1.0).dtype == torch.float32
