"""Generalised JSD: hand-computed values, the chunked version against the reference, gradients."""

import math

import pytest
import torch

from replayrl.algos.distillation import chunked_generalized_jsd, generalized_jsd

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
