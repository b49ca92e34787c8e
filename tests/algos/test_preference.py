"""Preference losses against hand-computed values (scalar `math`, not torch) and gradient checks.

Reference inputs (one token per completion): policy chosen -1, ref chosen -5 (logratio +4); policy rejected
-7, ref rejected -5 (logratio -2); so Delta = 6, and with beta = 0.1, beta * Delta = 0.6.
"""

import math

import pytest
import torch

from replayrl.algos.preference import (
    DPO_LOSSES,
    PairLogps,
    bradley_terry_loss,
    dpo_logits,
    dpo_losses,
    implicit_rewards,
    pairwise_accuracy,
    wpo_log_weights,
    wpo_weights,
)

BETA = 0.1


def logsig(x: float) -> float:
    return -math.log1p(math.exp(-x))


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def pairs(chosen=-1.0, rejected=-7.0, ref_chosen=-5.0, ref_rejected=-5.0, lc=1.0, lr=1.0, dtype=torch.float64):
    t = lambda v: torch.tensor([v], dtype=dtype, requires_grad=True)  # noqa: E731
    return PairLogps(t(chosen), t(rejected), t(ref_chosen), t(ref_rejected), t(lc).detach(), t(lr).detach())


# Expected loss at the reference inputs, each written out from its paper's formula.
Z = 0.6  # beta * Delta
EXPECTED = {
    "sigmoid": -logsig(Z),
    "hinge": 1 - Z,
    "ipo": (6 - 1 / (2 * BETA)) ** 2,
    "exo_pair": sig(Z) * (logsig(Z) - math.log(1 - 1e-3)) + sig(-Z) * (logsig(-Z) - math.log(1e-3)),
    "nca_pair": -logsig(0.4) - 0.5 * logsig(-0.4) - 0.5 * logsig(0.2),
    "bco_pair": -logsig(0.4 - 0.1) - logsig(-(-0.2 - 0.1)),  # delta = mean(0.4, -0.2) = 0.1
    "sppo_hard": (4 - 5) ** 2 + (-2 + 5) ** 2,
    "aot": -logsig(Z),  # a batch of one: sorting changes nothing
    "aot_pair": -logsig(Z),
    "aot_unpaired": -logsig(Z),  # TRL 1.16 name of aot_pair
    "apo_zero": 1 - sig(0.4) + sig(-0.2),
    "apo_down": sig(0.4) + 1 - sig(0.6),
    "discopop": -logsig(Z) * (1 - sig(Z / 0.05)) + math.exp(-Z) * sig(Z / 0.05),
    "sft": 1.0,  # -log pi(chosen) / 1 token
    "sigmoid_norm": -logsig(Z),
    "robust": -logsig(Z),  # label_smoothing 0: plain sigmoid
}


def test_registry_has_every_loss_with_a_hand_value():
    assert set(DPO_LOSSES) == set(EXPECTED)


@pytest.mark.parametrize("loss_type", sorted(EXPECTED))
def test_loss_value_at_delta_6(loss_type):
    value = DPO_LOSSES[loss_type](pairs(), BETA, {}).item()
    assert value == pytest.approx(EXPECTED[loss_type], abs=1e-9)


def test_notes_sanity_values():
    # ../shared/notes/trainer-family.md: sigmoid 0.437488, hinge 0.4, IPO 1.0
    assert DPO_LOSSES["sigmoid"](pairs(), BETA, {}).item() == pytest.approx(0.437488, abs=1e-6)
    assert DPO_LOSSES["hinge"](pairs(), BETA, {}).item() == pytest.approx(0.4, abs=1e-12)
    assert DPO_LOSSES["ipo"](pairs(), BETA, {}).item() == pytest.approx(1.0, abs=1e-12)


def _grad_wrt_delta(loss_type: str, p: PairLogps) -> float:
    """dL/dDelta: Delta moves with the policy's chosen log-prob at slope 1."""
    DPO_LOSSES[loss_type](p, BETA, {}).sum().backward()
    return p.chosen.grad.item()


@pytest.mark.parametrize(
    ("loss_type", "grad"), [("sigmoid", -0.035434), ("hinge", -0.1), ("ipo", 2.0), ("sigmoid_norm", -0.035434)]
)
def test_gradient_at_delta_6(loss_type, grad):
    assert _grad_wrt_delta(loss_type, pairs()) == pytest.approx(grad, abs=1e-6)


def test_policy_equals_reference_gives_ln2_and_slope_minus_half_beta():
    p = pairs(chosen=-3.0, rejected=-4.0, ref_chosen=-3.0, ref_rejected=-4.0)
    loss = DPO_LOSSES["sigmoid"](p, BETA, {})
    assert loss.item() == pytest.approx(math.log(2), abs=1e-12)
    loss.backward()
    assert p.chosen.grad.item() == pytest.approx(-BETA / 2, abs=1e-12)
    assert p.rejected.grad.item() == pytest.approx(BETA / 2, abs=1e-12)


def test_ipo_divides_by_completion_length():
    # 3 tokens each, summed logratios +12 and -6: per-token Delta = 6 -> the one-token value 1.0
    p = pairs(chosen=-3.0, rejected=-21.0, ref_chosen=-15.0, ref_rejected=-15.0, lc=3.0, lr=3.0)
    assert DPO_LOSSES["ipo"](p, BETA, {}).item() == pytest.approx(1.0, abs=1e-12)
    assert DPO_LOSSES["sigmoid"](p, BETA, {}).item() == pytest.approx(-logsig(1.8), abs=1e-12)  # sums: Delta 18


def test_label_smoothing_values():
    eps = 0.1
    robust = DPO_LOSSES["robust"](pairs(), BETA, {"label_smoothing": eps}).item()
    assert robust == pytest.approx(((1 - eps) * -logsig(Z) - eps * -logsig(-Z)) / (1 - 2 * eps), abs=1e-12)
    cdpo = DPO_LOSSES["sigmoid"](pairs(), BETA, {"label_smoothing": eps}).item()
    assert cdpo == pytest.approx((1 - eps) * -logsig(Z) + eps * -logsig(-Z), abs=1e-12)
    exo = DPO_LOSSES["exo_pair"](pairs(), BETA, {"label_smoothing": eps}).item()
    assert exo == pytest.approx(sig(Z) * (logsig(Z) - math.log(0.9)) + sig(-Z) * (logsig(-Z) - math.log(0.1)))


def test_aot_sorts_across_the_batch():
    # two pairs: policy logratios (c - r) = [1, 5], ref (c - r) = [4, 0] -> sorted diffs [1-0, 5-4] = [1, 1]
    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    p = PairLogps(t(0.0, 0.0), t(-1.0, -5.0), t(0.0, 0.0), t(-4.0, 0.0))
    assert DPO_LOSSES["aot"](p, 1.0, {}).tolist() == pytest.approx([-logsig(1.0)] * 2)
    # aot_pair sorts logratio(c) = [0, 0] and logratio(r) = [3, -5] -> [-5, 3] -> Delta [5, -3]
    assert DPO_LOSSES["aot_pair"](p, 1.0, {}).tolist() == pytest.approx([-logsig(5.0), -logsig(-3.0)])


def test_f_divergences():
    p = pairs()
    assert dpo_logits(p, "reverse_kl").item() == pytest.approx(6.0)
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
    assert dpo_logits(p, "js_divergence").item() == pytest.approx(6 - (softplus(4) - softplus(-2)))
    assert dpo_logits(p, "alpha_divergence", 0.5).item() == pytest.approx((math.exp(1.0) - math.exp(-2.0)) / 0.5)
    # TRL 1.16: f'(u) = (u^(alpha-1) - 1) / (alpha - 1); Delta = f'(u_c) - f'(u_r), log u_c = 4, log u_r = -2
    f_alpha = lambda a, lr: (math.exp((a - 1) * lr) - 1) / (a - 1)  # noqa: E731
    assert dpo_logits(p, "alpha_divergence", 2.0).item() == pytest.approx(f_alpha(2.0, 4) - f_alpha(2.0, -2))
    assert dpo_logits(p, "alpha_divergence", 1.0).item() == pytest.approx(6.0)  # the limit: reverse KL
    forward = (1 - math.exp(-4)) - (1 - math.exp(2))  # f'(u) = 1 - 1/u
    assert dpo_logits(p, "forward_kl").item() == pytest.approx(forward)
    assert dpo_logits(p, "alpha_divergence", 0.0).item() == pytest.approx(forward)
    with pytest.raises(ValueError, match="f_divergence_type"):
        dpo_logits(p, "kl")


def test_ld_token_weights_hand_computed():
    from replayrl.algos.preference import ld_token_weights, shared_completion_lengths

    # one pair: chosen completion of 2 tokens (after 1 prompt column), rejected of 4
    positions = torch.tensor([[0, 1, 2, 0, 0], [0, 1, 2, 3, 4]])
    shared = shared_completion_lengths(torch.tensor([2, 4]))
    assert shared.tolist() == [2, 2]
    weights = ld_token_weights(positions, shared[:, None], 0.3)
    assert torch.allclose(weights, torch.tensor([[0, 1, 1, 0, 0], [0, 1, 1, 0.3, 0.3]]))


@pytest.mark.parametrize("loss_type", sorted(EXPECTED))
def test_gradcheck(loss_type):
    torch.manual_seed(0)
    base = [torch.randn(4, dtype=torch.float64) * 2 - 5 for _ in range(4)]
    lengths = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)

    def f(c, r, rc, rr):
        return DPO_LOSSES[loss_type](PairLogps(c, r, rc, rr, lengths, lengths), BETA, {"bco_delta": 0.05})

    inputs = tuple(x.clone().requires_grad_(True) for x in base)
    assert torch.autograd.gradcheck(f, inputs)


def test_weighted_combination():
    p = pairs()
    total, parts = dpo_losses(["sigmoid", "sft"], p, BETA, [0.8, 0.2])
    assert total.item() == pytest.approx(0.8 * EXPECTED["sigmoid"] + 0.2 * EXPECTED["sft"])
    assert set(parts) == {"sigmoid", "sft"}
    total, _ = dpo_losses("hinge", p, BETA)
    assert total.item() == pytest.approx(0.4)


def test_unknown_loss_type_lists_the_valid_ones():
    with pytest.raises(ValueError, match="valid loss types are .*'apo_zero'.*'sigmoid'"):
        dpo_losses(["sigmoid", "sigmod"], pairs(), BETA)
    with pytest.raises(ValueError, match="loss_weights has 1 entries but loss_type has 2"):
        dpo_losses(["sigmoid", "ipo"], pairs(), BETA, [1.0])


def test_implicit_rewards():
    chosen, rejected = implicit_rewards(pairs(), BETA)
    assert chosen.item() == pytest.approx(0.4) and rejected.item() == pytest.approx(-0.2)
    assert not chosen.requires_grad


def test_bradley_terry_values_and_gradient():
    rc = torch.tensor([2.0, 0.5], dtype=torch.float64, requires_grad=True)
    rr = torch.tensor([1.0, 1.5], dtype=torch.float64, requires_grad=True)
    loss = bradley_terry_loss(rc, rr)
    assert loss.item() == pytest.approx((-logsig(1.0) - logsig(-1.0)) / 2)
    loss.backward()
    assert rc.grad.tolist() == pytest.approx([-sig(-1.0) / 2, -sig(1.0) / 2])
    margin = torch.tensor([0.5, 0.0], dtype=torch.float64)
    assert bradley_terry_loss(rc, rr, margin).item() == pytest.approx((-logsig(0.5) - logsig(-1.0)) / 2)
    centred = bradley_terry_loss(rc, rr, center_rewards_coefficient=0.01).item()
    assert centred == pytest.approx((-logsig(1.0) - logsig(-1.0)) / 2 + 0.01 * (3.0**2 + 2.0**2) / 2)


def test_pairwise_accuracy_counts_ties_as_wrong():
    acc = pairwise_accuracy(torch.tensor([1.0, 2.0, 3.0, 0.0]), torch.tensor([0.0, 2.0, 4.0, -1.0]))
    assert acc.item() == pytest.approx(0.5)


def test_wpo_weights_match_a_slow_reference():
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 3, 5), torch.randint(0, 5, (2, 3))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    got = wpo_log_weights(logits, labels, mask)
    for i in range(2):
        terms = []
        for t in range(3):
            if mask[i, t]:
                p = torch.softmax(logits[i, t], -1)
                terms.append(math.log(p[labels[i, t]].item()) - math.log((p**2).sum().item()))
        assert got[i].item() == pytest.approx(sum(terms) / len(terms), abs=1e-5)
    assert wpo_weights(torch.tensor([0.5]), torch.tensor([0.1])).item() == 1.0
    assert wpo_weights(torch.tensor([-0.5]), torch.tensor([-0.1])).item() == pytest.approx(math.exp(-0.6))
