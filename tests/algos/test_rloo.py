"""RLOO's leave-one-out advantages and per-sequence clipped loss: hand-computed values, loop reference."""

import math

import pytest
import torch

from replayrl.algos.rloo import (
    leave_one_out_advantages,
    normalize_advantages,
    rloo_advantages,
    sequence_clipped_surrogate,
)


def test_leave_one_out_hand_values():
    # group [1, 2, 4]: baselines (2+4)/2=3, (1+4)/2=2.5, (1+2)/2=1.5; group [0, 1, 1]: 1, 0.5, 0.5
    rewards = torch.tensor([1.0, 2.0, 4.0, 0.0, 1.0, 1.0])
    expected = torch.tensor([-2.0, -0.5, 2.5, -1.0, 0.5, 0.5])
    torch.testing.assert_close(leave_one_out_advantages(rewards, 3), expected)
    # = G/(G-1) * (r - group mean) when every reward is scored
    mean = rewards.view(2, 3).mean(1, keepdim=True)
    torch.testing.assert_close(leave_one_out_advantages(rewards, 3), (1.5 * (rewards.view(2, 3) - mean)).view(-1))


def test_unscored_rewards_are_left_out_and_get_zero():
    # group [1, nan, 4]: the NaN is nobody's baseline; group [7, nan]: 7 has no scored sibling
    rewards = torch.tensor([1.0, math.nan, 4.0, 7.0, math.nan, 3.0])
    raw = leave_one_out_advantages(rewards.view(-1)[:3], 3)
    torch.testing.assert_close(raw[[0, 2]], torch.tensor([-3.0, 3.0]))
    assert raw[1].isnan()
    out = rloo_advantages(torch.tensor([1.0, math.nan, 4.0, 7.0, math.nan, 5.0]), 3)
    torch.testing.assert_close(out, torch.tensor([-3.0, 0.0, 3.0, 2.0, 0.0, -2.0]))
    torch.testing.assert_close(rloo_advantages(torch.tensor([7.0, math.nan]), 2), torch.tensor([0.0, 0.0]))


def test_normalize_hand_values():
    # A = [-2, -0.5, 2.5]: mean 0, unbiased std sqrt((4 + 0.25 + 6.25) / 2) = sqrt(5.25)
    a = torch.tensor([-2.0, -0.5, 2.5])
    torch.testing.assert_close(normalize_advantages(a, eps=0.0), a / math.sqrt(5.25))
    # NaN (no baseline) is left out of the statistics, then 0
    torch.testing.assert_close(
        normalize_advantages(torch.tensor([-2.0, math.nan, -0.5, 2.5]), eps=0.0),
        torch.tensor([-2.0, 0.0, -0.5, 2.5]) / math.sqrt(5.25),
    )


def _loop_reference(rewards: list[float], G: int) -> list[float]:
    out = []
    for start in range(0, len(rewards), G):
        group = rewards[start : start + G]
        for i, r in enumerate(group):
            others = [x for j, x in enumerate(group) if j != i and not math.isnan(x)]
            out.append(0.0 if math.isnan(r) or not others else r - sum(others) / len(others))
    return out


@pytest.mark.parametrize("G", [2, 3, 8])
def test_vectorised_equals_loop(G):
    gen = torch.Generator().manual_seed(G)
    rewards = torch.randn(5 * G, generator=gen, dtype=torch.float64)
    rewards[torch.rand(5 * G, generator=gen) < 0.2] = math.nan
    expected = torch.tensor(_loop_reference(rewards.tolist(), G), dtype=torch.float64)
    torch.testing.assert_close(rloo_advantages(rewards, G), expected)


def test_sequence_clipped_surrogate_hand_values():
    # ratio 1.5 with A=+1: clipped at 1.2 -> loss -1.2, no gradient; ratio 0.5 with A=-1: clipped at 0.8 -> 0.8;
    # ratio 1.1 with A=+2: inside the clip -> -2.2 with gradient -2.2 (d/dlogr of -r A = -r A)
    log_ratio = torch.tensor([math.log(1.5), math.log(0.5), math.log(1.1)], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 2.0])
    loss, ratio, low, high = sequence_clipped_surrogate(log_ratio, adv, 0.2, 0.2)
    torch.testing.assert_close(loss, torch.tensor([-1.2, 0.8, -2.2]))
    assert low.tolist() == [False, True, False] and high.tolist() == [True, False, False]
    loss.sum().backward()
    torch.testing.assert_close(log_ratio.grad, torch.tensor([0.0, 0.0, -2.2]))
