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


# ------------------------------------------------------------------------------ chunked, from hidden states
from replayrl.algos.logprobs import (  # noqa: E402
    CPU_CHUNK_BYTES,
    DEFAULT_CHUNK_BYTES,
    chunked_token_stats,
    default_chunk_size,
    linear_cross_entropy,
)


def make_head(n=(3, 7), hidden=5, vocab=13, dtype=torch.float32, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*n, hidden, generator=g).to(dtype).requires_grad_(True)
    w = torch.randn(vocab, hidden, generator=g).to(dtype).requires_grad_(True)
    b = torch.randn(vocab, generator=g).to(dtype).requires_grad_(True) if bias else None
    targets = torch.randint(vocab, n, generator=g)
    return h, w, b, targets


def plain_stats(h, w, b, targets, temperature=1.0):
    """The plain implementation: full logits, full float32 log-softmax."""
    logits = torch.nn.functional.linear(h, w, b).float() / temperature
    logp = torch.log_softmax(logits, -1)
    logps = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logps, -(logp.exp() * logp).sum(-1), logits.argmax(-1)


def grads(out, params):
    return torch.autograd.grad(out, [p for p in params if p is not None])


@pytest.mark.parametrize("chunk_size", [1, 3, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_from_hidden_equals_plain_fp32(chunk_size, temperature):
    h, w, b, targets = make_head()
    stats = chunked_token_stats(
        h,
        targets,
        weight=w,
        bias=b,
        temperature=temperature,
        with_entropy=True,
        with_predicted=True,
        chunk_size=chunk_size,
    )
    logps, entropy, predicted = plain_stats(h, w, b, targets, temperature)
    torch.testing.assert_close(stats.logps, logps)
    torch.testing.assert_close(stats.entropy, entropy)
    assert torch.equal(stats.predicted, predicted)
    assert not stats.entropy.requires_grad  # a metric unless entropy_grad
    assert chunked_token_stats(h, targets, weight=w, bias=b).predicted is None  # the argmax only when asked for
    upstream = torch.randn(targets.shape, generator=torch.Generator().manual_seed(1))
    for got, want in zip(grads((stats.logps * upstream).sum(), (h, w, b)), grads((logps * upstream).sum(), (h, w, b))):
        torch.testing.assert_close(got, want)


def test_chunked_entropy_gradient_equals_plain():
    h, w, b, targets = make_head(bias=False)
    stats = chunked_token_stats(h, targets, weight=w, with_entropy=True, entropy_grad=True, chunk_size=4)
    logps, entropy, _ = plain_stats(h, w, None, targets)
    mixed, plain_mixed = (stats.logps - 0.3 * stats.entropy).sum(), (logps - 0.3 * entropy).sum()
    for got, want in zip(grads(mixed, (h, w)), grads(plain_mixed, (h, w))):
        torch.testing.assert_close(got, want)


def test_chunked_from_logits_with_mask_and_repeated_use():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 6, 9, generator=g)[:, :-1].requires_grad_(True)  # non-contiguous, like logits[:, :-1]
    targets = torch.randint(9, (2, 5), generator=g)
    mask = torch.rand(2, 5, generator=g) > 0.4
    stats = chunked_token_stats(logits, targets, mask=mask, with_entropy=True, with_predicted=True, chunk_size=2)
    logp = torch.log_softmax(logits, -1)
    ref = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask
    torch.testing.assert_close(stats.logps, ref)
    assert (stats.predicted[~mask] == -1).all() and (stats.entropy[~mask] == 0).all()
    torch.testing.assert_close(grads(stats.logps.sum(), [logits])[0], grads(ref.sum(), [logits])[0])


def test_chunked_bf16_is_close_to_fp32_plain():
    h, w, b, targets = make_head(n=(4, 9), hidden=16, vocab=50, dtype=torch.bfloat16)
    stats = chunked_token_stats(h, targets, weight=w, bias=b, with_entropy=True, chunk_size=5)
    assert stats.logps.dtype == torch.float32  # each chunk is upcast before the softmax
    ref = [x.detach().float().requires_grad_(True) for x in (h, w, b)]
    logps, entropy, _ = plain_stats(*ref, targets)
    torch.testing.assert_close(stats.logps, logps, atol=0.05, rtol=0.02)
    torch.testing.assert_close(stats.entropy, entropy, atol=0.05, rtol=0.02)
    for got, want in zip(grads(stats.logps.sum(), (h, w, b)), grads(logps.sum(), ref)):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.05)


def test_linear_cross_entropy_equals_torch_cross_entropy():
    h, w, b, labels = make_head(bias=False)
    labels = labels.clone()
    labels[0, :3] = -100
    loss = linear_cross_entropy(h, w, labels, chunk_size=2)
    ref = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w).flatten(0, 1), labels.flatten())
    torch.testing.assert_close(loss, ref)
    for got, want in zip(grads(loss, (h, w)), grads(ref, (h, w))):
        torch.testing.assert_close(got, want)
    assert linear_cross_entropy(h, w, torch.full_like(labels, -100)).item() == 0.0
    with pytest.raises(ValueError, match="reduction='avg'"):
        linear_cross_entropy(h, w, labels, reduction="avg")


def test_default_chunk_size_bounds_a_chunk():
    assert default_chunk_size(151_936) * 151_936 * 4 <= DEFAULT_CHUNK_BYTES == 256 * 2**20
    assert default_chunk_size(151_936) == default_chunk_size(151_936, device="cuda:0") == 441
    assert default_chunk_size(151_936, device=torch.device("cpu")) == 13  # CPU_CHUNK_BYTES: 8 MiB
    # on an accelerator at most an eighth of the positions, within [32 MiB, 256 MiB] of float32 logits
    assert default_chunk_size(151_936, device="cuda:0", positions=8192) == 441  # an SFT/GRPO step: 19 chunks
    assert default_chunk_size(151_936, device="cuda:0", positions=640) == 80  # DPO's short pairs: 8 chunks
    assert default_chunk_size(151_936, device="cuda:0", positions=100) == 55  # never under 32 MiB worth
    assert default_chunk_size(151_936, device="cpu", positions=8192) == 13
    assert default_chunk_size(151_936, 4 * 151_936 * 3, device="cpu") == 3
    assert default_chunk_size(10**12) == 1


def peak_allocated_bytes(fn) -> int:
    """Peak of live CPU bytes allocated by torch while `fn` runs, from the profiler's allocation events."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


QWEN2_VOCAB = 151_936


def fused_losses(dtype):
    """(name, plain loss, chunked loss) from hidden states ``(2, 64, 16)`` through a 152k-row lm_head: what each
    trainer's loss differentiates (GRPO/DPO/KTO/PPO log-probs, GRPO's entropy bonus, SFT's cross-entropy)."""
    h, w, _, targets = make_head(n=(2, 64), hidden=16, vocab=QWEN2_VOCAB, dtype=dtype, bias=False)
    entropy_bonus = lambda logps, entropy: (logps - 0.3 * entropy).sum()  # noqa: E731
    cases = {
        "token_logps": (
            lambda: plain_stats(h, w, None, targets)[0].sum(),
            lambda: chunked_token_stats(h, targets, weight=w, chunk_size=8).logps.sum(),
        ),
        "logps_and_entropy_grad": (
            lambda: entropy_bonus(*plain_stats(h, w, None, targets)[:2]),
            lambda: entropy_bonus(
                *chunked_token_stats(h, targets, weight=w, with_entropy=True, entropy_grad=True, chunk_size=8)[:2]
            ),
        ),
        "sft_cross_entropy": (
            lambda: torch.nn.functional.cross_entropy(
                torch.nn.functional.linear(h, w).float().flatten(0, 1), targets.flatten()
            ),  # fmt: skip
            lambda: linear_cross_entropy(h, w, targets, chunk_size=8),
        ),
    }
    return (h, w), cases


def measure(params, loss_fns):
    """{(peak bytes, loss, gradients)} of forward + backward of each loss function, in this order."""
    out = []
    for fn in loss_fns:
        got = {}

        def step(fn=fn, got=got):
            loss = fn()
            got["loss"], got["grads"] = loss.detach(), grads(loss, params)

        out.append((peak_allocated_bytes(step), got["loss"], got["grads"]))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["token_logps", "logps_and_entropy_grad", "sft_cross_entropy"])
def test_chunked_loss_path_allocates_a_small_fraction_of_the_plain_one_on_a_152k_vocabulary(case, dtype):
    """Forward + backward of each loss on Qwen2's 151,936-token vocabulary from hidden states and the lm_head (the
    fused path every trainer takes): the plain path holds several (N, V) float32 tensors, the chunked one a few
    chunks and the lm_head's gradient. Same loss and gradients."""
    params, cases = fused_losses(dtype)
    (plain_peak, plain_loss, plain_grads), (peak, loss, got) = measure(params, cases[case])
    logits_bytes = 2 * 64 * QWEN2_VOCAB * 4
    assert plain_peak >= 2 * logits_bytes  # measured, not assumed: the plain path really holds the logits
    assert peak <= 0.15 * plain_peak, (peak, plain_peak)
    torch.testing.assert_close(loss, plain_loss, rtol=1e-5, atol=1e-5)  # float32 math on both sides
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)  # 152k-term sums
    for g, want in zip(got, plain_grads):
        assert g.dtype == dtype
        torch.testing.assert_close(g, want, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_log_probs_from_logits_allocate_only_their_gradient_beyond_a_small_fraction(dtype):
    """The fallback path (a model whose logits are not just the lm_head's): given ``(N, V)`` logits, the chunked
    log-probs add the logits' own gradient (the caller needs it) and a few chunks; the plain log_softmax + gather
    adds several float32 (N, V) tensors."""
    h, w, _, targets = make_head(n=(2, 64), hidden=16, vocab=QWEN2_VOCAB, dtype=dtype, bias=False)
    logits = torch.nn.functional.linear(h, w).detach().requires_grad_(True)
    plain = lambda: torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None]).sum()  # noqa: E731
    chunked = lambda: chunked_token_stats(logits, targets, chunk_size=8).logps.sum()  # noqa: E731
    (plain_peak, plain_loss, (plain_grad,)), (peak, loss, (grad,)) = measure([logits], [plain, chunked])
    grad_bytes = logits.numel() * logits.element_size()
    assert plain_peak >= 2 * logits.numel() * 4
    assert peak - grad_bytes <= 0.15 * plain_peak, (peak, grad_bytes, plain_peak)
    torch.testing.assert_close(loss, plain_loss)
    torch.testing.assert_close(grad, plain_grad)


def test_chunked_entropy_metric_allocates_a_small_fraction_of_the_plain_one():
    """Metrics under no_grad (the entropy every trainer logs, SFT's token accuracy): chunk by chunk from the hidden
    states, against the plain full-vocabulary softmax."""
    h, w, _, targets = make_head(n=(2, 64), hidden=16, vocab=QWEN2_VOCAB, bias=False)
    got = {}

    def plain():
        with torch.no_grad():
            got["plain"] = plain_stats(h, w, None, targets)

    def chunked():
        with torch.no_grad():
            got["chunked"] = chunked_token_stats(
                h, targets, weight=w, with_entropy=True, with_predicted=True, chunk_size=8
            )

    plain_peak, peak = peak_allocated_bytes(plain), peak_allocated_bytes(chunked)
    assert plain_peak >= 2 * 2 * 64 * QWEN2_VOCAB * 4
    assert peak <= 0.15 * plain_peak, (peak, plain_peak)
    (logps, entropy, predicted), stats = got["plain"], got["chunked"]
    torch.testing.assert_close(stats.logps, logps)
    torch.testing.assert_close(stats.entropy, entropy, atol=1e-4, rtol=1e-5)  # sums of 152k terms
    assert torch.equal(stats.predicted, predicted)


def test_chunked_peak_does_not_grow_with_the_number_of_positions():
    """With the default chunk size the loss path's memory is a few chunks whatever the batch: 8x the positions
    (128 -> 1024 on the 152k vocabulary) adds only the per-position vectors, not a (N, V) tensor."""
    peaks = []
    for n in (64, 512):
        h, w, _, targets = make_head(n=(2, n), hidden=16, vocab=QWEN2_VOCAB, bias=False)

        def step(h=h, w=w, targets=targets):
            stats = chunked_token_stats(h, targets, weight=w, with_entropy=True, entropy_grad=True)
            grads((stats.logps - 0.3 * stats.entropy).sum(), (h, w))

        peaks.append(peak_allocated_bytes(step))
    assert peaks[1] - peaks[0] <= 2**20, peaks  # 896 more positions x 16 hidden: kilobytes, not 896 x 152k x 4
    assert peaks[1] <= 6 * CPU_CHUNK_BYTES + QWEN2_VOCAB * 16 * 4, peaks  # a few (CPU) chunks + the head's gradient
