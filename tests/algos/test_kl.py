import math

import pytest
import torch

from replayrl.algos import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3

LOG2 = math.log(2)


def test_hand_values():
    # pi = 0.5, pi_ref = 0.25  ->  log(ref / pi) = -log 2
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    assert kl_k1(logp, ref).item() == pytest.approx(LOG2)
    assert kl_k2(logp, ref).item() == pytest.approx(0.5 * LOG2**2)  # 0.240227
    assert kl_k3(logp, ref).item() == pytest.approx(0.5 + LOG2 - 1)  # 0.193147
    # swapped: log(ref / pi) = +log 2
    assert kl_k1(ref, logp).item() == pytest.approx(-LOG2)
    assert kl_k3(ref, logp).item() == pytest.approx(2 - LOG2 - 1)  # 0.306853


def test_k3_nonnegative_and_zero_at_equality():
    g = torch.Generator().manual_seed(0)
    logps, ref = -5 * torch.rand(4, 16, generator=g), -5 * torch.rand(4, 16, generator=g)
    assert (kl_k3(logps, ref) >= 0).all()
    for fn in KL_ESTIMATORS.values():
        assert (fn(logps, logps) == 0).all()


def test_k1_k3_unbiased_exact_expectation():
    # E_{x~pi}[k] over a full categorical equals KL(pi || ref) exactly for k1 and k3.
    g = torch.Generator().manual_seed(1)
    logp = torch.log_softmax(torch.randn(1, 10, generator=g, dtype=torch.float64), -1)
    ref = torch.log_softmax(torch.randn(1, 10, generator=g, dtype=torch.float64), -1)
    kl = (logp.exp() * (logp - ref)).sum()
    for fn in (kl_k1, kl_k3):
        torch.testing.assert_close((logp.exp() * fn(logp, ref)).sum(), kl)


def test_registry():
    assert KL_ESTIMATORS == {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
