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


def test_log_probs_at_matches_log_softmax_gather_with_repeated_sources():
    from replayrl.algos.logprobs import log_probs_at

    logits, _ = make(shape=(2, 6, 9), seed=3)
    logits.requires_grad_(True)
    sources = torch.tensor([[2, 3, 2, 5], [0, 0, 4, 1]])  # a position may predict two tokens (prefix sharing)
    targets = torch.tensor([[1, 8, 4, 0], [7, 2, 2, 5]])
    out = log_probs_at(logits, sources, targets)
    slow = torch.stack(
        [torch.stack([torch.log_softmax(logits[b, s], -1)[t] for s, t in zip(sources[b], targets[b])]) for b in (0, 1)]
    )
    torch.testing.assert_close(out, slow)
    (grad,) = torch.autograd.grad(out.sum(), logits)
    (slow_grad,) = torch.autograd.grad(slow.sum(), logits)
    torch.testing.assert_close(grad, slow_grad)
    # hand value: uniform logits give -log V whatever the source
    uniform = log_probs_at(torch.zeros(1, 2, 4), torch.tensor([[1, 1]]), torch.tensor([[0, 3]]))
    assert uniform[0].tolist() == pytest.approx([-math.log(4)] * 2, abs=1e-6)


def test_log_probs_at_bf16_is_computed_in_float32():
    from replayrl.algos.logprobs import log_probs_at

    logits, index = make(shape=(2, 5, 300), seed=4)
    sources = torch.arange(5).repeat(2, 1)
    out = log_probs_at(logits.bfloat16(), sources, index)
    ref = reference_logps(logits.bfloat16().float(), index)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_log_probs_at_reads_each_index_row_from_its_logits_row():
    from replayrl.algos.logprobs import log_probs_at

    logits, _ = make(shape=(2, 4, 7), seed=5)
    sources, targets = torch.tensor([[1, 2], [0, 3], [3, 3]]), torch.tensor([[6, 0], [1, 2], [5, 4]])
    rows = torch.tensor([1, 0, 1])  # three index rows packed into two logits rows
    out = log_probs_at(logits, sources, targets, rows)
    slow = [
        [torch.log_softmax(logits[r, s], -1)[t] for s, t in zip(ss, ts)] for r, ss, ts in zip(rows, sources, targets)
    ]
    torch.testing.assert_close(out, torch.tensor(slow))
