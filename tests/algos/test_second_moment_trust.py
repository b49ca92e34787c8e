"""M2PO's second-moment token mask (`algos.second_moment_trust_mask`, arXiv:2510.01161): hand values and a brute-force
reference."""

import torch

from replayrl.algos import second_moment_trust_mask


def test_hand_values():
    # (log r)^2 = 0.01, 0.04, 0.25, 1.0 (mask all): mean 0.325 > 0.11; the 3 smallest: 0.1 <= 0.11 -> drop the 1.0
    log_ratio = torch.tensor([[0.1, -0.2], [0.5, -1.0]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    assert second_moment_trust_mask(log_ratio, mask, 0.11).tolist() == [[True, True], [True, False]]
    # threshold 0.02: the 2 smallest have mean 0.025 > 0.02, so only the 0.01 token stays
    assert second_moment_trust_mask(log_ratio, mask, 0.02).tolist() == [[True, False], [False, False]]
    # within the threshold already: nothing dropped; tokens outside the mask never kept
    mask = torch.tensor([[True, True], [False, False]])
    assert second_moment_trust_mask(log_ratio, mask, 0.1).tolist() == [[True, True], [False, False]]
    assert not second_moment_trust_mask(log_ratio, torch.zeros(2, 2, dtype=torch.bool), 0.1).any()


def test_matches_the_largest_subset_of_smallest_values_by_brute_force():
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        log_ratio = torch.randn(3, 4, generator=generator)
        mask = torch.rand(3, 4, generator=generator) > 0.3
        kept = second_moment_trust_mask(log_ratio, mask, 0.3)
        m2 = log_ratio.pow(2)
        assert not (kept & ~mask).any() and (m2[kept].mean() <= 0.3 if kept.any() else True)
        # the kept tokens are the k smallest, with k the largest count whose mean fits: check every k
        values = sorted(m2[mask].tolist())
        best = max((k for k in range(len(values) + 1) if k == 0 or sum(values[:k]) / k <= 0.3), default=0)
        assert int(kept.sum()) == best
        if best and best < len(values):
            assert m2[kept].max() <= min(v for v in m2[mask & ~kept].tolist())
