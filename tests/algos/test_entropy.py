"""Entropy masking (arXiv:2506.01939), adaptive entropy coefficient, MaxRL / GDPO advantages: hand values."""

import pytest
import torch

from replayrl import algos


def test_high_entropy_mask_keeps_the_top_quantile_of_real_tokens():
    ent = torch.tensor([[0.1, 0.9, 0.5, 7.0], [0.3, 0.7, 0.2, 0.4]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])  # the 7.0 is padding and must not set the threshold
    keep = algos.high_entropy_mask(ent, mask, 0.5)
    # real entropies 0.1 .2 .3 .4 .5 .7 .9: median 0.4 -> keep >= 0.4
    assert keep.tolist() == [[False, True, True, False], [False, True, False, True]]
    assert algos.high_entropy_mask(ent, mask, 1.0).equal(mask.bool())
    assert algos.high_entropy_mask(ent, mask, 0.0).sum() == 1  # only the highest real token


def test_pool_sets_the_threshold():
    ent = torch.tensor([[1.0, 2.0]])
    pool = torch.tensor([0.0, 10.0, 20.0, float("nan")])
    assert algos.high_entropy_mask(ent, torch.ones(1, 2), 0.5, pool=pool).sum() == 0  # median 10


def test_adaptive_entropy_coef_steps_and_clamps():
    assert algos.adaptive_entropy_coef(0.0, 0.1, 0.2, 0.005, 0.0, 1.0) == pytest.approx(0.005)
    assert algos.adaptive_entropy_coef(0.0, 0.3, 0.2, 0.005, 0.0, 1.0) == 0.0
    assert algos.adaptive_entropy_coef(0.999, 0.1, 0.2, 0.005, 0.0, 1.0) == 1.0
    assert algos.applied_entropy_coef(0.5, 0.3, 0.2, adaptive=True) == 0.0
    assert algos.applied_entropy_coef(0.5, 0.1, 0.2, adaptive=True) == 0.5
    assert algos.applied_entropy_coef(0.5, 0.3, 0.2, adaptive=False) == 0.5
    # adaptive: no bonus before the first measurement (TRL starts from last entropy = inf)
    assert algos.applied_entropy_coef(0.5, None, 0.2, adaptive=True) == 0.0
    assert algos.applied_entropy_coef(0.5, None, 0.2, adaptive=False) == 0.5


def test_entropy_quantile_mask_is_trls_threshold():
    ent = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    # real entropies 0.1 .. 1.0 (10 values): the 0.8 quantile is 0.1 + 0.8 * 9 * 0.1 = 0.82 -> keep 0.9 and 1.0
    keep = algos.entropy_quantile_mask(ent, mask, 0.8)
    assert keep.nonzero().tolist() == [[1, 2], [1, 3]]
    assert algos.entropy_quantile_mask(ent, mask, 0.0).equal(mask.bool())  # every real token
    assert algos.entropy_quantile_mask(ent, mask, 1.0).nonzero().tolist() == [[1, 3]]  # the highest real token
    assert not algos.entropy_quantile_mask(ent, torch.zeros_like(mask), 0.5).any()  # no real token: none kept
    # high_entropy_mask(top_quantile=q) is the (1 - q) quantile
    assert algos.high_entropy_mask(ent, mask, 0.5).equal(algos.entropy_quantile_mask(ent, mask, 0.5))


def test_mean_scaling_divides_by_the_group_mean():
    adv = algos.group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, "mean", eps=0.0)
    assert torch.allclose(adv, torch.tensor([3.0, -1.0, -1.0, -1.0]))  # (r - 0.25) / 0.25


def test_normalize_then_sum_normalises_each_reward_before_summing():
    # reward 0 has scale 100, reward 1 scale 1: after per-function normalisation both count equally
    per_func = torch.tensor([[100.0, 0.0], [0.0, 1.0]])
    summed, adv = algos.normalize_then_sum_advantages(per_func, torch.tensor([1.0, 1.0]), 2, eps=0.0)
    s = 2**0.5 / 2  # (x - mean) / std for two values is +-1/sqrt(2)
    assert torch.allclose(summed, torch.tensor([s - s, -s + s]), atol=1e-6)
    per_func = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    summed, adv = algos.normalize_then_sum_advantages(per_func, torch.tensor([1.0, 1.0]), 2, eps=0.0)
    assert torch.allclose(summed, torch.tensor([2 * s, -2 * s, 0.0, 0.0]), atol=1e-6)
    assert torch.allclose(adv, summed / summed.std(), atol=1e-6)
