"""KTO's losses, reference point and mismatched pairs: hand-computed values and a loop reference."""

import math

import pytest
import torch

from replayrl.algos.kto import kto_losses, kto_reference_point, mismatched_partners


def test_kto_hand_values():
    # beta 0.1, log-ratio 2, z0 0.5: desirable 1 - sigmoid(0.15) = 0.462570, undesirable 1 - sigmoid(-0.15) = 0.537430
    r = torch.tensor([2.0, 2.0])
    out = kto_losses(r, torch.tensor([True, False]), 0.5, beta=0.1)
    torch.testing.assert_close(out, torch.tensor([0.462570, 0.537430]))
    # the weights scale each side; policy == reference and z0 = 0 give 0.5 everywhere
    out = kto_losses(r, torch.tensor([True, False]), 0.5, beta=0.1, desirable_weight=2.0, undesirable_weight=0.5)
    torch.testing.assert_close(out, torch.tensor([2 * 0.462570, 0.5 * 0.537430]))
    torch.testing.assert_close(kto_losses(torch.zeros(2), torch.tensor([True, False]), 0.0, 0.1), torch.full((2,), 0.5))


def test_apo_zero_unpaired_hand_values_ignore_the_reference_point():
    r = torch.tensor([2.0, 2.0])
    for z0 in (0.0, 3.0):
        out = kto_losses(r, torch.tensor([True, False]), z0, beta=0.1, loss_type="apo_zero_unpaired")
        torch.testing.assert_close(out, torch.tensor([0.450166, 0.549834]))


def test_gradient_and_detached_reference_point():
    # d/dr (1 - sigmoid(beta (r - z0))) = -beta s (1 - s) with s = sigmoid(0.15); z0 gets no gradient
    r = torch.tensor([2.0], requires_grad=True)
    z0 = torch.tensor(0.5, requires_grad=True)
    kto_losses(r, torch.tensor([True]), z0, beta=0.1).sum().backward()
    s = 1 / (1 + math.exp(-0.15))
    assert r.grad.item() == pytest.approx(-0.1 * s * (1 - s), rel=1e-5)
    assert z0.grad is None


def test_reference_point_is_a_clamped_mean():
    assert kto_reference_point(torch.tensor(3.0), torch.tensor(4.0)).item() == 0.75
    assert kto_reference_point(torch.tensor(-3.0), torch.tensor(4.0)).item() == 0.0
    assert kto_reference_point(torch.tensor(0.0), torch.tensor(0.0)).item() == 0.0


def loop_kto_losses(logratios, desirable, z0, beta, w_d, w_u, loss_type):
    """One row at a time in floats, from the formulas of the papers (arXiv:2402.01306, arXiv:2408.06266)."""
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    out = []
    for r, good in zip(logratios.tolist(), desirable.tolist()):
        if loss_type == "kto":
            out.append(w_d * (1 - sigmoid(beta * (r - z0))) if good else w_u * (1 - sigmoid(beta * (z0 - r))))
        else:
            out.append(w_d * (1 - sigmoid(beta * r)) if good else w_u * sigmoid(beta * r))
    return torch.tensor(out)


@pytest.mark.parametrize("loss_type", ["kto", "apo_zero_unpaired"])
def test_vectorised_equals_loop(loss_type):
    g = torch.Generator().manual_seed(0)
    r = torch.randn(64, generator=g, dtype=torch.float64) * 5
    desirable = torch.rand(64, generator=g) < 0.4
    fast = kto_losses(r, desirable, 0.7, 0.3, desirable_weight=1.33, undesirable_weight=0.8, loss_type=loss_type)
    torch.testing.assert_close(fast, loop_kto_losses(r, desirable, 0.7, 0.3, 1.33, 0.8, loss_type).double())


def test_unknown_loss_type():
    with pytest.raises(ValueError, match="loss_type must be one of \\('kto', 'apo_zero_unpaired'\\)"):
        kto_losses(torch.zeros(1), torch.tensor([True]), 0.0, 0.1, loss_type="bco")


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8])
def test_mismatched_partners_use_every_completion_once_never_their_own(n):
    partners = mismatched_partners(n)
    assert sorted(partners.tolist()) == list(range(n))
    assert (partners != torch.arange(n)).all()


def test_mismatched_partners_hand_values_and_split_invariance():
    assert mismatched_partners(4).tolist() == [1, 0, 3, 2]
    assert mismatched_partners(5).tolist() == [1, 0, 4, 2, 3]
    # two processes of 4 rows pair exactly as one process of 8
    halves = torch.cat([mismatched_partners(4), mismatched_partners(4) + 4])
    assert halves.tolist() == mismatched_partners(8).tolist()
    with pytest.raises(ValueError, match="at least 2 rows"):
        mismatched_partners(1)
