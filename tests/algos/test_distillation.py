"""Generalised JSD: hand-computed values, the chunked version against the reference, gradients."""

import math

import pytest
import torch
import torch.nn.functional as F

from replayrl.algos.distillation import chunked_generalized_jsd, generalized_jsd, jsd_value_and_grad
from tests.algos.test_logprobs import peak_allocated_bytes

# two-token vocabulary: student [0.5, 0.5], teacher [0.9, 0.1]
S = torch.log(torch.tensor([[0.5, 0.5]]))
T = torch.log(torch.tensor([[0.9, 0.1]]))


def test_hand_values():
    forward_kl = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)  # KL(t || s) = 0.368064
    reverse_kl = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)  # KL(s || t) = 0.510826
    # beta 0.5: m = [0.7, 0.3]
    jsd = 0.5 * (0.9 * math.log(0.9 / 0.7) + 0.1 * math.log(0.1 / 0.3)) + 0.5 * (
        0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3)
    )
    assert generalized_jsd(S, T, 0.0).item() == pytest.approx(forward_kl, rel=1e-5)
    assert generalized_jsd(S, T, 1.0).item() == pytest.approx(reverse_kl, rel=1e-5)
    assert generalized_jsd(S, T, 0.5).item() == pytest.approx(jsd, rel=1e-5)
    assert jsd == pytest.approx(0.101750, abs=1e-6)
    assert generalized_jsd(T, T, 0.3).item() == pytest.approx(0.0, abs=1e-7)
    # temperature 2 on both: the same formula on the softened distributions
    soft_s, soft_t = torch.log_softmax(S / 2, -1), torch.log_softmax(T / 2, -1)
    assert generalized_jsd(S, T, 1.0, temperature=2.0).item() == pytest.approx(
        generalized_jsd(soft_s, soft_t, 1.0).item()
    )
    with pytest.raises(ValueError, match="beta must be in"):
        generalized_jsd(S, T, 1.5)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
def test_chunked_on_hidden_states_equals_the_reference_with_gradients(beta):
    gen = torch.Generator().manual_seed(0)
    hs, ht = torch.randn(13, 8, generator=gen, requires_grad=True), torch.randn(13, 6, generator=gen)
    ws, wt = torch.randn(11, 8, generator=gen, requires_grad=True), torch.randn(11, 6, generator=gen)
    bias = torch.randn(11, generator=gen)
    chunked = chunked_generalized_jsd((hs, ws, bias), (ht, wt, None), beta, temperature=0.7, chunk_size=4)
    reference = generalized_jsd(hs @ ws.T + bias, ht @ wt.T, beta, temperature=0.7)
    torch.testing.assert_close(chunked, reference)
    grads = torch.autograd.grad(chunked.sum(), (hs, ws))
    expected = torch.autograd.grad(reference.sum(), (hs, ws))
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a, b)
    # logits given directly (no lm_head weight)
    logits = (hs @ ws.T).detach()
    direct = chunked_generalized_jsd((logits, None, None), (ht @ wt.T, None, None), beta, chunk_size=5)
    torch.testing.assert_close(direct, generalized_jsd(logits, ht @ wt.T, beta))


def test_closed_form_gradient_hand_values():
    # d/dz KL(t || s) = p_s - p_t;  d/dz KL(s || t) = p_s (log p_s - log p_t - KL) = 0.5 * [-ln 3, ln 3]
    _, grad = jsd_value_and_grad(S.clone(), T.clone(), 0.0, 1.0, want_grad=True)
    torch.testing.assert_close(grad, torch.tensor([[-0.4, 0.4]]))
    value, grad = jsd_value_and_grad(S.clone(), T.clone(), 1.0, 1.0, want_grad=True)
    assert value.item() == pytest.approx(0.510826, abs=1e-6)
    torch.testing.assert_close(grad, 0.5 * math.log(3) * torch.tensor([[-1.0, 1.0]]))
    # temperature 2: the gradient w.r.t. the raw logits is the softened one over 2
    _, soft = jsd_value_and_grad(S / 2, T / 2, 0.5, 1.0, want_grad=True)
    _, grad = jsd_value_and_grad(S.clone(), T.clone(), 0.5, 2.0, want_grad=True)
    torch.testing.assert_close(grad, soft / 2)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_closed_form_gradient_equals_autograd(beta, temperature):
    gen = torch.Generator().manual_seed(1)
    zs = (3 * torch.randn(5, 40, generator=gen)).requires_grad_()
    zt = 3 * torch.randn(5, 40, generator=gen)
    reference = generalized_jsd(zs, zt, beta, temperature)
    (expected,) = torch.autograd.grad(reference.sum(), zs)
    value, grad = jsd_value_and_grad(zs.detach().clone(), zt.clone(), beta, temperature, want_grad=True)
    torch.testing.assert_close(value, reference.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6)


def _heads(dtype, gen, bias=True):
    hs = torch.randn(23, 8, generator=gen).to(dtype).requires_grad_()
    ws = torch.randn(37, 8, generator=gen).to(dtype).requires_grad_()
    bs = torch.randn(37, generator=gen).to(dtype).requires_grad_() if bias else None
    ht, wt = torch.randn(23, 6, generator=gen).to(dtype), torch.randn(37, 6, generator=gen).to(dtype)
    return (hs, ws, bs), (ht, wt, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("upstream", ["sum", "masked weights"])
def test_fast_equals_slow_values_and_gradients(dtype, beta, upstream):
    """Uniform upstream gradient (the trainer's sum) uses the forward's gradient; per-position weights (a mask,
    a weighted mean) recompute the chunks. Both against autograd through the plain full-logits reference."""
    student, teacher = _heads(dtype, torch.Generator().manual_seed(2))
    weights = torch.ones(23) if upstream == "sum" else (torch.arange(23) % 3 != 0).float() * torch.linspace(0.5, 2, 23)
    fast = chunked_generalized_jsd(student, teacher, beta, temperature=0.8, chunk_size=5)
    slow = generalized_jsd(F.linear(*student).float(), F.linear(*teacher).float(), beta, temperature=0.8)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(fast, slow, **tol)
    got = torch.autograd.grad((fast * weights).sum(), student)
    want = torch.autograd.grad((slow * weights).sum(), student)
    for a, b in zip(got, want):
        assert a.dtype == dtype
        scale = b.float().abs().max().item() if dtype == torch.bfloat16 else 1.0  # bf16: to the gradient's size
        torch.testing.assert_close(a.float(), b.float(), rtol=tol["rtol"], atol=tol["atol"] * scale)


def test_no_graph_without_grad_and_teacher_gets_none():
    student, teacher = _heads(torch.float32, torch.Generator().manual_seed(3), bias=False)
    teacher = (teacher[0].requires_grad_(), teacher[1], None)
    with torch.no_grad():
        values = chunked_generalized_jsd(student, teacher, 0.5, chunk_size=4)
    assert values.grad_fn is None
    out = chunked_generalized_jsd(student, teacher, 0.5, chunk_size=4)
    out.mean().backward()
    assert teacher[0].grad is None and student[0].grad is not None
    with pytest.raises(ValueError, match="beta must be in"):
        chunked_generalized_jsd(student, teacher, -0.1)


def test_divergence_allocates_a_small_fraction_of_the_plain_one_on_a_152k_vocabulary():
    """Measured with the profiler's allocation events: forward + backward of 64 positions, beta 0.5 (measured:
    34 MB against 428 MB)."""
    gen = torch.Generator().manual_seed(4)
    vocab, width, n = 151_936, 16, 64
    hs, ws = torch.randn(n, width, generator=gen).requires_grad_(), (0.1 * torch.randn(vocab, width)).requires_grad_()
    ht, wt = torch.randn(n, width, generator=gen), 0.1 * torch.randn(vocab, width)
    results = {}

    def plain():
        value = generalized_jsd(F.linear(hs, ws), F.linear(ht, wt), 0.5).sum()
        results["plain"] = (value.detach(), torch.autograd.grad(value, (hs, ws)))

    def chunked():
        value = chunked_generalized_jsd((hs, ws, None), (ht, wt, None), 0.5, chunk_size=8).sum()
        results["chunked"] = (value.detach(), torch.autograd.grad(value, (hs, ws)))

    plain_peak, chunked_peak = peak_allocated_bytes(plain), peak_allocated_bytes(chunked)
    assert plain_peak >= 4 * n * vocab * 4  # the plain path really holds several (n, V) float32 tensors
    assert chunked_peak <= 0.15 * plain_peak, (chunked_peak, plain_peak)
    (plain_value, plain_grads), (value, grads) = results["plain"], results["chunked"]
    torch.testing.assert_close(value, plain_value, rtol=1e-5, atol=1e-5)  # float32 sums over 152k terms
    for got, want in zip(grads, plain_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
