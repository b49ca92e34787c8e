"""PPO math: hand-computed values (trainer-family notes) and the GAE loop reference vs the vectorised version."""

import math

import pytest
import torch

from replayrl.algos.ppo import (
    AdaptiveKLController,
    FixedKLController,
    RunningMoments,
    advantages_and_returns,
    approx_kl,
    gae,
    gae_reference,
    kl_penalty,
    last_token_index,
    masked_mean,
    masked_var,
    masked_whiten,
    policy_loss,
    token_rewards,
    value_loss,
)

LOGP = torch.tensor([[0.5, 0.2, 0.1], [0.6, 0.2, 0.1]])
REF = torch.tensor([[0.4, 0.3, 0.0], [0.7, 0.1, 0.3]])


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("kl", [[0.1, -0.1, 0.1], [-0.1, 0.1, -0.2]]),
        ("abs", [[0.1, 0.1, 0.1], [0.1, 0.1, 0.2]]),
        ("mse", [[0.005, 0.005, 0.005], [0.005, 0.005, 0.02]]),
    ],
)
def test_kl_penalty_sanity_values(kind, expected):
    torch.testing.assert_close(kl_penalty(LOGP, REF, kind), torch.tensor(expected), atol=1e-6, rtol=0)


def test_full_kl_penalty_is_the_exact_kl():
    pi = torch.tensor([[[0.5, 0.25, 0.25]]])
    ref = torch.tensor([[[0.25, 0.5, 0.25]]])
    expected = 0.5 * math.log(2) + 0.25 * math.log(0.5)  # sum pi log(pi / ref) = 0.173287
    got = kl_penalty(None, None, "full", pi.log(), ref.log())
    assert got.shape == (1, 1) and got.item() == pytest.approx(expected, abs=1e-6)
    assert kl_penalty(None, None, "full", pi.log(), pi.log()).item() == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(ValueError, match="full log-prob"):
        kl_penalty(LOGP, REF, "full")
    with pytest.raises(ValueError, match="unknown kl_penalty"):
        kl_penalty(LOGP, REF, "k3")


def test_masked_statistics_hand_values():
    x = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    torch.testing.assert_close(masked_mean(x, mask, axis=1), torch.tensor([1.5, 3.0]))
    assert masked_var(x, mask).item() == pytest.approx(1.0)  # ((1 + 0 + 1) / 3) * 3 / 2
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(2 / 3)
    white = masked_whiten(x, mask)
    torch.testing.assert_close(white[mask.bool()], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(masked_whiten(x, mask, shift_mean=False)[mask.bool()], torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="empty"):
        masked_var(x, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="single element"):
        masked_var(x, torch.tensor([[1, 0], [0, 0]]))


def test_adaptive_kl_controller_hand_values():
    ctl = AdaptiveKLController(0.2, target=6, horizon=10000)
    ctl.update(12.0, n_steps=256)  # error clipped to +0.2: beta *= 1 + 0.2 * 256 / 10000
    assert ctl.value == pytest.approx(0.2 * 1.00512)
    ctl = AdaptiveKLController(0.2, target=6, horizon=10000)
    ctl.update(6.0, n_steps=256)
    assert ctl.value == pytest.approx(0.2)
    ctl.update(4.5, n_steps=100)  # error -0.25 clipped to -0.2
    assert ctl.value == pytest.approx(0.2 * (1 - 0.2 * 100 / 10000))
    ctl.update(6.6, n_steps=1000)  # error +0.1
    assert ctl.value == pytest.approx(0.2 * 0.998 * 1.01)
    restored = AdaptiveKLController(1.0, 1.0, 1.0)
    restored.load_state_dict(ctl.state_dict())
    assert restored.state_dict() == ctl.state_dict()
    fixed = FixedKLController(0.3)
    fixed.update(100.0, 256)
    assert fixed.value == 0.3


def test_running_moments_match_the_whole_sample():
    moments = RunningMoments()
    assert moments.update(torch.tensor([1.0, 2.0, 3.0])) == pytest.approx((2.0, 1.0))
    moments.update(torch.tensor([4.0, 5.0]))
    assert moments.mean == pytest.approx(3.0)
    assert moments.std == pytest.approx(math.sqrt(2.5))  # unbiased std of 1..5


def test_token_rewards_put_the_score_on_the_last_response_token():
    kl = torch.tensor([[0.1, -0.1, 0.1], [-0.1, 0.1, -0.2]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards, non_score = token_rewards(torch.tensor([1.0, 2.0]), kl, 0.2, mask)
    torch.testing.assert_close(rewards, torch.tensor([[-0.02, 0.02, 0.98], [0.02, 1.98, 0.0]]))
    torch.testing.assert_close(non_score, torch.tensor([[-0.02, 0.02, -0.02], [0.02, -0.02, 0.0]]))
    # an interior hole in the mask (response_masks): the score still goes to the last unmasked token
    assert last_token_index(torch.tensor([[1, 1, 0, 1, 0], [0, 1, 0, 0, 0]])).tolist() == [3, 1]
    with pytest.raises(ValueError, match="no unmasked token"):
        last_token_index(torch.tensor([[0, 0]]))


def test_gae_hand_values():
    values, rewards = torch.tensor([[0.5, 0.2]]), torch.tensor([[0.1, 1.0]])
    # delta_1 = 1.0 - 0.2 = 0.8;  delta_0 = 0.1 + 0.9 * 0.2 - 0.5 = -0.22;  A_0 = -0.22 + 0.9 * 0.5 * 0.8 = 0.14
    for fn in (gae, gae_reference):
        torch.testing.assert_close(fn(values, rewards, torch.ones(1, 2), 0.9, 0.5), torch.tensor([[0.14, 0.8]]))
    advantages, returns = advantages_and_returns(values, rewards, torch.ones(1, 2), 0.9, 0.5, whiten=False)
    torch.testing.assert_close(returns, torch.tensor([[0.64, 1.0]]))
    # gamma = lam = 1: the advantage is the sum of future rewards minus the value
    torch.testing.assert_close(gae(values, rewards, torch.ones(1, 2), 1.0, 1.0), torch.tensor([[0.6, 0.8]]))


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.99, 0.9), (0.5, 0.0), (1.0, 1.0)])
def test_gae_vectorised_equals_loop(gamma, lam):
    g = torch.Generator().manual_seed(0)
    values, rewards = torch.randn(6, 23, generator=g, dtype=torch.float64), torch.randn(6, 23, generator=g).double()
    mask = (torch.rand(6, 23, generator=g) > 0.2).double()
    mask[:, 15:] = 0  # right padding
    fast, slow = gae(values, rewards, mask, gamma, lam), gae_reference(values, rewards, mask, gamma, lam)
    torch.testing.assert_close(fast, slow, atol=1e-10, rtol=1e-10)


def test_policy_loss_hand_values():
    old = torch.zeros(1, 2)
    logp = torch.full((1, 2), math.log(1.5))
    # ratio 1.5, eps 0.2: A = +1 -> max(-1.5, -1.2) = -1.2 (clipped); A = -1 -> max(1.5, 1.2) = 1.5 (not clipped)
    loss, clipfrac, ratio = policy_loss(logp, old, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), 0.2)
    assert loss.item() == pytest.approx(0.15)
    assert clipfrac.item() == pytest.approx(0.5)
    torch.testing.assert_close(ratio, torch.full((1, 2), 1.5))
    # a masked token does not count
    loss, clipfrac, _ = policy_loss(logp, old, torch.tensor([[1.0, -1.0]]), torch.tensor([[1, 0]]), 0.2)
    assert (loss.item(), clipfrac.item()) == pytest.approx((-1.2, 1.0))


def test_value_loss_hand_values():
    vpreds, old, returns = torch.tensor([[1.0, 0.9]]), torch.tensor([[0.5, 0.5]]), torch.tensor([[0.0, 1.0]])
    # token 0: clip(1.0, 0.3, 0.7) = 0.7 -> max(1.0, 0.49) = 1.0; token 1: clip -> 0.7 -> max(0.01, 0.09) = 0.09
    loss, clipfrac = value_loss(vpreds, old, returns, torch.ones(1, 2), 0.2, vf_coef=0.1)
    assert loss.item() == pytest.approx(0.1 * 0.5 * (1.0 + 0.09) / 2)
    assert clipfrac.item() == pytest.approx(0.5)


def test_approx_kl_hand_values():
    approx, policykl = approx_kl(torch.tensor([[0.2, -0.2, 0.3]]), torch.zeros(1, 3), torch.tensor([[1, 1, 0]]))
    assert approx.item() == pytest.approx(0.02)
    assert policykl.item() == pytest.approx(0.0, abs=1e-7)
