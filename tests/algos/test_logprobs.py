import math

import pytest
import torch

from replayrl.algos import entropy_from_logits, selective_log_softmax, token_logps_and_entropy


def make(dtype=torch.float32, shape=(3, 5, 11), seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(*shape, generator=g)).to(dtype)
    index = torch.randint(shape[-1], shape[:-1], generator=g)
    return logits, index


def reference_logps(logits, index):
    return torch.log_softmax(logits, -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_selective_log_softmax_matches_reference(dtype):
    logits, index = make(dtype)
    logits.requires_grad_(True)
    out = selective_log_softmax(logits, index)
    ref = reference_logps(logits, index)
    torch.testing.assert_close(out, ref)
    (grad,) = torch.autograd.grad(out.sum(), logits)
    (ref_grad,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(grad, ref_grad)


def test_selective_log_softmax_bf16():
    logits, index = make(torch.bfloat16)
    out = selective_log_softmax(logits, index)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, reference_logps(logits, index))
    torch.testing.assert_close(out.float(), reference_logps(logits.float(), index), atol=0.1, rtol=0.02)


@pytest.mark.parametrize("chunk_size", [1, 4, 128])
def test_entropy_matches_reference(chunk_size):
    logits, _ = make(torch.float64)
    logp = torch.log_softmax(logits, -1)
    torch.testing.assert_close(entropy_from_logits(logits, chunk_size), -(logp.exp() * logp).sum(-1))


def test_entropy_uniform_and_masked_logits():
    assert entropy_from_logits(torch.zeros(1, 2, 8))[0].tolist() == pytest.approx([math.log(8)] * 2)
    masked = torch.tensor([[[0.0, 0.0, -torch.inf, -torch.inf]]])
    assert entropy_from_logits(masked).item() == pytest.approx(math.log(2))


def test_token_logps_and_entropy_uses_temperature():
    logits, index = make(torch.float64)
    logps, entropy = token_logps_and_entropy(logits, index, temperature=0.7, with_entropy=True)
    scaled = torch.log_softmax(logits / 0.7, -1)
    torch.testing.assert_close(logps, scaled.gather(-1, index.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(entropy, -(scaled.exp() * scaled).sum(-1))
    assert token_logps_and_entropy(logits, index, 1.0, with_entropy=False)[1] is None
