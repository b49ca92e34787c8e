import math

import pytest
import torch

from replayrl.algos import PolicyLossParams, grpo_policy_loss, masked_mean, token_weights, truncated_is_weights


def clipped_surrogate(logps, old_logps, advantages, epsilon_low, epsilon_high, is_weights=None):
    """The PPO-clip per-token loss of the 'grpo' loss type (`policy_losses.ppo_clip_loss`), times optional detached
    importance weights as `grpo.objective` applies them: (per_token_loss, low_clipped, high_clipped, ratio)."""
    params = PolicyLossParams(epsilon_low=epsilon_low, epsilon_high=epsilon_high)
    out = grpo_policy_loss("grpo", logps, old_logps, advantages, torch.ones_like(logps), "token", params)
    loss = out.per_token_loss if is_weights is None else out.per_token_loss * is_weights.detach()
    return loss, out.low_clipped, out.high_clipped, out.ratio


LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]
MAX_LEN = 6


def test_clipped_surrogate_hand_values():
    # (ratio, A) -> loss, low-clipped, high-clipped with eps = 0.2
    ratios = torch.tensor([[1.5, 0.5, 0.5, 1.5]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss, low, high, ratio = [], [], [], []
    for j in range(4):  # one token per row so each row gets its own advantage
        out = clipped_surrogate(ratios[:, j : j + 1].log(), torch.zeros(1, 1), adv[:, j], 0.2, 0.2)
        loss.append(out[0].item()), low.append(out[1].item()), high.append(out[2].item()), ratio.append(out[3].item())
    assert loss == pytest.approx([-1.2, 0.8, -0.5, 1.5])
    assert low == [False, True, False, False]
    assert high == [True, False, False, False]
    assert ratio == pytest.approx([1.5, 0.5, 0.5, 1.5])


def test_clipped_surrogate_matches_loop_and_kills_clipped_gradients():
    g = torch.Generator().manual_seed(0)
    logps = (-2 * torch.rand(4, 7, generator=g, dtype=torch.float64)).requires_grad_(True)
    old = logps.detach() + 0.4 * torch.randn(4, 7, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0], dtype=torch.float64)
    isw = torch.rand(4, 7, generator=g, dtype=torch.float64)
    e_lo, e_hi = 0.2, 0.28
    loss, low, high, ratio = clipped_surrogate(logps, old, adv, e_lo, e_hi, is_weights=isw)
    for i in range(4):
        for j in range(7):
            r = math.exp(logps[i, j].item() - old[i, j].item())
            a = adv[i].item()
            expected = -min(r * a, min(max(r, 1 - e_lo), 1 + e_hi) * a) * isw[i, j].item()
            assert loss[i, j].item() == pytest.approx(expected)
            assert ratio[i, j].item() == pytest.approx(r)
            assert low[i, j].item() == (r < 1 - e_lo and a < 0)
            assert high[i, j].item() == (r > 1 + e_hi and a > 0)
    assert (low | high).any() and not (low | high).all()
    (grad,) = torch.autograd.grad(loss.sum(), logps)
    assert (grad[low | high] == 0).all() and (grad[~(low | high)] != 0).all()


def test_truncated_is_weights():
    prox = torch.tensor([[math.log(2), math.log(0.5), 0.0]], requires_grad=True)
    w = truncated_is_weights(prox, torch.zeros(1, 3), cap=1.5)
    assert w[0].tolist() == pytest.approx([1.5, 0.5, 1.0])
    assert not w.requires_grad


def random_batch(n=8, t=MAX_LEN, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([0, 1, 6, 3, 5, 2, 6, 4][:n])  # includes an empty completion
    mask = (torch.arange(t) < lengths.unsqueeze(1)).long()
    return mask, torch.randn(n, t, generator=g, dtype=torch.float64)


def loop_loss(loss_type, mask, per_token, num_tokens=None):
    rows = [[per_token[i, j].item() for j in range(mask.shape[1]) if mask[i, j]] for i in range(mask.shape[0])]
    total, count = sum(sum(r) for r in rows), sum(len(r) for r in rows)
    if loss_type == "grpo":
        return sum(sum(r) / max(len(r), 1) for r in rows) / len(rows)
    if loss_type == "bnpo":
        return total / max(count, 1)
    if loss_type == "dr_grpo":
        return total / (len(rows) * MAX_LEN)
    return total / (num_tokens if num_tokens is not None else count)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_token_weights_match_loop(loss_type):
    mask, per_token = random_batch()
    w = token_weights(mask, loss_type, MAX_LEN)
    assert w.shape == mask.shape and (w[mask == 0] == 0).all()
    assert (per_token * w).sum().item() == pytest.approx(loop_loss(loss_type, mask, per_token))


def test_dapo_uses_given_token_count():
    mask, per_token = random_batch()
    w = token_weights(mask, "dapo", MAX_LEN, num_tokens=13.5)
    assert (per_token * w).sum().item() == pytest.approx(loop_loss("dapo", mask, per_token, num_tokens=13.5))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("micro_batch", [8, 1, 4])
def test_micro_batch_split_invariance(loss_type, micro_batch):
    mask, per_token = random_batch()
    w = token_weights(mask, loss_type, MAX_LEN)
    total = sum(
        (per_token[s : s + micro_batch] * w[s : s + micro_batch]).sum().item() for s in range(0, 8, micro_batch)
    )
    assert total == pytest.approx(loop_loss(loss_type, mask, per_token))


def test_token_weights_unknown_loss_type():
    with pytest.raises(ValueError, match="'ppo'"):
        token_weights(torch.ones(2, 3), "ppo", 3)  # type: ignore[arg-type]


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 1]])
    assert masked_mean(x, mask).item() == pytest.approx(3.0)
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0
