import math

import pytest
import torch

from replayrl.algos import group_advantages, group_rewards_view, group_std, zero_std_groups

NAN = float("nan")
EPS = 1e-4


def t(values):
    return torch.tensor(values, dtype=torch.float64)


def test_group_rewards_view_shape_and_invariant():
    assert group_rewards_view(torch.arange(8.0), 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(AssertionError):
        group_rewards_view(torch.arange(7.0), 4)


def test_hand_example_group_scaling():
    rewards = t([1, 0, 0, 1, 2, 2, 2, 2])
    # group means 0.5 and 2; unbiased std of [1,0,0,1] = sqrt(1/3) = 0.57735
    torch.testing.assert_close(group_std(rewards, 4), t([math.sqrt(1 / 3), 0.0]))
    assert zero_std_groups(rewards, 4).tolist() == [False, True]
    a = 0.5 / (math.sqrt(1 / 3) + EPS)  # 0.86588...
    assert a == pytest.approx(0.866, abs=1e-3)
    torch.testing.assert_close(group_advantages(rewards, 4, "group"), t([a, -a, -a, a, 0, 0, 0, 0]))


def test_hand_example_batch_and_none_scaling():
    rewards = t([1, 0, 0, 1, 2, 2, 2, 2])
    # global mean 1.25, sum of squared deviations 5.5, unbiased std sqrt(5.5 / 7) = 0.886405
    batch_std = math.sqrt(5.5 / 7)
    a = 0.5 / (batch_std + EPS)
    torch.testing.assert_close(group_advantages(rewards, 4, "batch"), t([a, -a, -a, a, 0, 0, 0, 0]))
    torch.testing.assert_close(group_advantages(rewards, 4, "none"), t([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))


def test_nan_rewards_are_ignored_and_get_zero_advantage():
    # group 1 scored [1, 3, 2]: mean 2, std 1; group 2 unscored; group 3 has a single scored member.
    rewards = t([1, NAN, 3, 2, NAN, NAN, NAN, NAN, 5, NAN, NAN, NAN])
    torch.testing.assert_close(group_std(rewards, 4), t([1.0, 0.0, 0.0]))
    assert zero_std_groups(rewards, 4).tolist() == [False, True, True]
    a = 1 / (1 + EPS)
    expected = t([-a, 0, a, 0] + [0] * 8)
    torch.testing.assert_close(group_advantages(rewards, 4, "group"), expected)
    # batch std over the scored [1, 3, 2, 5]: mean 2.75, squared deviations sum 8.75, std sqrt(8.75 / 3)
    b = 1 / (math.sqrt(8.75 / 3) + EPS)
    torch.testing.assert_close(group_advantages(rewards, 4, "batch"), t([-b, 0, b, 0] + [0] * 8))
    torch.testing.assert_close(group_advantages(rewards, 4, "none"), t([-1, 0, 1, 0] + [0] * 8))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_never_nan(scale):
    for rewards in (t([NAN] * 4), t([NAN, 1.0, NAN, NAN]), t([3.0] * 4)):
        adv = group_advantages(rewards, 2, scale)
        assert not adv.isnan().any()
        assert adv.tolist() == [0.0] * 4


def test_group_std_matches_torch_std_without_nan():
    rewards = torch.randn(24, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(group_std(rewards, 6), rewards.view(4, 6).std(-1))


def test_zero_std_tolerance():
    assert zero_std_groups(t([1.0, 1.0 + 1e-7, 1.0, 1.1]), 2).tolist() == [True, False]
    assert zero_std_groups(t([1.0, 1.1]), 2, atol=0.2).tolist() == [True]


def test_unknown_scale_rewards():
    with pytest.raises(ValueError, match="'bogus'"):
        group_advantages(t([1.0, 0.0]), 2, "bogus")  # type: ignore[arg-type]
