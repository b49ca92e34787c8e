"""Token log-probs, entropies and argmax predictions over a large vocabulary, chunk by chunk.

With vocabularies of ~150k entries the logits of a batch are the largest tensors of a step: 8k tokens x 152k x 4
bytes is 5 GB in float32, and a plain ``log_softmax(logits).gather(...)`` keeps several such copies alive for the
backward pass. Everything here works on ``chunk_size`` positions (rows) at a time:

- `chunked_token_stats` is the one entry point. Its ``source`` is either the logits ``(..., V)`` or, with
  ``weight`` (the lm_head's ``(V, H)``, plus an optional ``bias``), the hidden states ``(..., H)`` before the
  lm_head: a fused linear + log-softmax that never forms more than one chunk of logits. Per position it returns the
  log-prob of the target token, optionally the entropy of the distribution and the argmax prediction, all float32.
  Its backward (`_VocabChunks`, a custom autograd function) recomputes each chunk's logits instead of saving them,
  so the graph holds only ``source`` itself (which the model keeps anyway).
- `linear_cross_entropy`: the SFT cross-entropy from hidden states through the same path.
- `selective_log_softmax`, `entropy_from_logits`, `token_logps_and_entropy`, `log_probs_at`: the older
  logits-based helpers, now thin wrappers over the chunked path.

Each chunk's logits are upcast to float32 before the softmax (as TRL does for its loss), so bf16 models get
float32 log-probs; in float32 the numbers equal the plain ``log_softmax`` ones (tests/algos/test_logprobs.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

# Bytes of float32 logits one chunk may hold (its softmax and gradient take about as much again, twice). On an
# accelerator every chunk reads the lm_head's weight (272 MB at 152k x 896 in bf16) three times and adds into its
# gradient once, and launches a dozen kernels: 32 MiB chunks (55 rows at 152k) made an 8 x 1024-token SFT step on
# an H200 2.3x TRL's time, so chunks there are up to 256 MiB (441 rows; ~0.8 GB transient, against the 7.5 GB of a
# full bf16 + float32 logits copy), but at most an eighth of the positions of the call (at least 32 MiB): a batch
# of a few hundred positions (DPO's pairs) gains nothing from large chunks and would hold their buffers. A CPU's
# matrix products are compute-bound already at a few rows, and there every chunk buffer is resident memory (freed
# ones too: glibc keeps blocks under its 32 MiB mmap threshold in the heap), so chunks are small: on the 152k
# vocabulary, 13 rows against 55, the same step time and ~160 MiB less peak RSS in the DPO step of
# `benchmarks/scale.py`.
DEFAULT_CHUNK_BYTES = 256 * 2**20
MIN_CHUNK_BYTES = 32 * 2**20
CPU_CHUNK_BYTES = 8 * 2**20


class TokenStats(NamedTuple):
    """Per-position results of `chunked_token_stats`, each shaped like its ``targets``.

    ``logps``: float32 log-prob of the target token (0 where not computed); ``entropy``: float32 entropy in nats
    (None unless asked for); ``predicted``: argmax token id (-1 where not computed; None unless asked for: on a CPU
    the arg-max reduction costs about as much as the softmax's ``exp``), no gradient.
    """

    logps: Tensor
    entropy: Tensor | None
    predicted: Tensor | None


def default_chunk_size(
    vocab_size: int, chunk_bytes: int | None = None, device=None, positions: int | None = None
) -> int:
    """Positions per chunk so that one chunk of float32 logits takes at most ``chunk_bytes`` (default:
    `CPU_CHUNK_BYTES` on a CPU ``device``, else `DEFAULT_CHUNK_BYTES`). On an accelerator, given the number of
    ``positions`` to compute, a chunk also holds at most an eighth of them (but at least `MIN_CHUNK_BYTES` worth):
    large chunks only pay where there are many positions, and a short batch (DPO's pairs) keeps a small transient."""
    on_cpu = device is not None and torch.device(device).type == "cpu"
    rows = lambda budget: max(1, budget // (4 * max(vocab_size, 1)))  # noqa: E731
    if chunk_bytes is not None or on_cpu:
        return rows(chunk_bytes or CPU_CHUNK_BYTES)
    if positions is None:
        return rows(DEFAULT_CHUNK_BYTES)
    return min(rows(DEFAULT_CHUNK_BYTES), max(rows(MIN_CHUNK_BYTES), -(-positions // 8)))


def _chunk_logits(source: Tensor, weight: Tensor | None, bias: Tensor | None, index, sl: slice, temperature: float):
    """float32 logits (c, V) of the chunk ``sl`` of the selected positions."""
    rows = source[tuple(i[sl] for i in index)]  # (c, D): a copy of this chunk only
    logits = rows if weight is None else F.linear(rows, weight, bias)
    logits = logits.to(_compute_dtype(source))  # a fresh tensor either way (indexing copies): safe to divide in place
    return logits.div_(temperature) if temperature != 1.0 else logits


def _compute_dtype(source: Tensor) -> torch.dtype:
    """float32, or float64 for float64 inputs (the reference tests)."""
    return torch.float64 if source.dtype == torch.float64 else torch.float32


class _VocabChunks(torch.autograd.Function):
    """Log-probs (and entropies, argmax) at N selected positions, computed and differentiated chunk by chunk.

    ``source``: logits ``(..., V)`` (``weight`` None) or hidden states ``(..., H)`` with ``weight (V, H)`` and
    ``bias (V,)`` or None; ``index``: a tuple of ``source.ndim - 1`` long tensors ``(N,)`` picking the positions;
    ``targets (N,)``. Returns ``logps (N,)``, ``entropy (N,)`` (empty when not asked for) and ``predicted (N,)``.
    Only ``source``, ``weight`` and the indices are saved; backward recomputes each chunk's logits.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")  # backward recomputes under the forward's autocast state
    def forward(ctx, source, weight, bias, index, targets, temperature, chunk, with_entropy, entropy_grad, with_argmax):
        n = targets.shape[0]
        device = source.device
        dtype = _compute_dtype(source)
        logps = torch.empty(n, dtype=dtype, device=device)
        entropy = torch.empty(n if with_entropy else 0, dtype=dtype, device=device)
        predicted = torch.empty(n if with_argmax else 0, dtype=torch.long, device=device)
        # Each position's largest logit and sum of exp(logit - largest): backward's softmax without a reduction
        shift, total = torch.empty(n, dtype=dtype, device=device), torch.empty(n, dtype=dtype, device=device)
        for start in range(0, n, chunk):
            sl = slice(start, start + chunk)
            logits = _chunk_logits(source, weight, bias, index, sl, temperature)
            if with_argmax:
                predicted[sl] = logits.argmax(-1)
            shift[sl], total[sl], logps[sl], ent = _chunk_stats(logits, targets[sl], with_entropy, weight is None)
            if with_entropy:
                entropy[sl] = ent
            del logits, ent
        ctx.save_for_backward(source, weight, bias, targets, shift, total, *index)
        ctx.settings = (temperature, chunk, entropy_grad and with_entropy)
        ctx.mark_non_differentiable(predicted)
        if not (entropy_grad and with_entropy):
            ctx.mark_non_differentiable(entropy)
        return logps, entropy, predicted

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_logps, grad_entropy, _grad_predicted):
        source, weight, bias, targets, shift, total, *index = ctx.saved_tensors
        temperature, chunk, entropy_grad = ctx.settings
        need_source, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_source = torch.zeros_like(source) if need_source else None
        grad_weight = torch.zeros_like(weight) if weight is not None and need_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias else None
        for start in range(0, targets.shape[0], chunk):
            sl = slice(start, start + chunk)
            z = _chunk_logits(source, weight, bias, index, sl, temperature).sub_(shift[sl, None])
            scale = grad_logps[sl] / temperature
            if entropy_grad:
                logp = z.sub_(total[sl, None].log())
                g = _chunk_grad(logp, logp.exp(), targets[sl], grad_logps[sl], grad_entropy[sl]).div_(temperature)
            else:  # scale * (onehot - e / total), written over the shifted logits
                g = z.exp_().mul_((-scale / total[sl])[:, None])
                g.scatter_add_(-1, targets[sl, None], scale[:, None].to(g.dtype))
            del z
            rows = tuple(i[sl] for i in index)
            if weight is None:
                if need_source:
                    grad_source.index_put_(rows, g.to(source.dtype), accumulate=True)
                continue
            g = g.to(weight.dtype)
            if need_source:
                grad_source.index_put_(rows, g @ weight, accumulate=True)
            if need_weight:
                grad_weight.addmm_(g.T, source[rows].to(weight.dtype))
            if need_bias:
                grad_bias += g.float().sum(0)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_source, grad_weight, grad_bias, None, None, None, None, None, None, None


def _chunk_stats(
    logits: Tensor, targets: Tensor, with_entropy: bool, masked: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(largest logit, sum of exp(logit - largest), log-prob of the target, entropy or None)`` per row of float
    logits ``(c, V)`` (overwritten), in four passes over the chunk (six with the entropy, one extra buffer).

    With ``z`` the shifted logits (largest 0), ``e = exp(z)`` and ``s = sum e``: ``log p_y = z_y - log s`` and the
    entropy ``-sum p log p = log s - sum(e z) / s``. ``masked``: logits that may hold -inf, where ``e z`` is taken
    as its limit 0."""
    shift = logits.amax(-1, keepdim=True)
    z = logits.sub_(shift)
    z_target = z.gather(-1, targets[:, None]).squeeze(-1)
    entropy = None
    if with_entropy:
        e = z.exp()
        total = e.sum(-1)
        ez = e.mul_(z)
        entropy = total.log() - (ez.nan_to_num_(nan=0.0) if masked else ez).sum(-1) / total
    else:
        total = z.exp_().sum(-1)
    return shift.squeeze(-1), total, z_target - total.log(), entropy


def _log_softmax_and_softmax(logits: Tensor) -> tuple[Tensor, Tensor]:
    """``(log_softmax, softmax)`` of float logits ``(c, V)`` with one ``exp`` pass and one extra buffer: the
    log-softmax is written over ``logits``."""
    logits -= logits.amax(-1, keepdim=True)  # shifted: the largest is 0
    p = logits.exp()
    total = p.sum(-1, keepdim=True)
    logits -= total.log()
    p /= total
    return logits, p


def _plogp_(p: Tensor, logp: Tensor) -> Tensor:
    """``p * log p`` written over ``p``, with its limit 0 where ``log p`` is -inf (masked logits: 0 * -inf)."""
    return p.mul_(logp).nan_to_num_(nan=0.0)


def _chunk_grad(logp: Tensor, p: Tensor, targets: Tensor, grad_logps: Tensor, grad_entropy: Tensor | None) -> Tensor:
    """d(loss)/d(logits) of one chunk, float32 ``(c, V)``, from its log-softmax and softmax (``p`` is overwritten).

    ``d log p_y / d z = onehot(y) - p``; ``d H / d z = -p * (log p + H)`` with ``H = -sum p log p``.
    """
    if grad_entropy is not None:
        plogp = _plogp_(p.clone(), logp)
        ent = -plogp.sum(-1, keepdim=True)
        entropy_part = plogp.add_(p * ent).mul_(-grad_entropy[:, None])
    g = p.mul_(-grad_logps[:, None])
    g.scatter_add_(-1, targets[:, None], grad_logps[:, None].to(g.dtype))
    if grad_entropy is not None:
        g += entropy_part
    return g


def chunked_token_stats(
    source: Tensor,
    targets: Tensor,
    *,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    mask: Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    with_predicted: bool = False,
    chunk_size: int | None = None,
) -> TokenStats:
    """Log-prob of each target token under ``softmax(logits / temperature)``, without a full-vocabulary copy.

    ``source``: the logits ``(*S, V)``, or with ``weight`` the hidden states ``(*S, H)`` that the lm_head
    (``weight (V, H)``, ``bias (V,)`` or None) maps to them; ``targets``: long ``(*S)``; ``mask``: bool ``(*S)``,
    the positions to compute (None: all). Returns `TokenStats` shaped ``(*S)``; ``logps`` (and with
    ``entropy_grad`` the entropy) carry gradients to ``source``, ``weight`` and ``bias``. ``chunk_size``: positions
    per chunk (default: `default_chunk_size`). ``with_entropy`` without ``entropy_grad`` is a metric (no gradient);
    ``with_predicted``: also the argmax token (SFT's token accuracy).
    """
    if targets.shape != source.shape[:-1]:
        raise ValueError(f"targets {tuple(targets.shape)} must match source {tuple(source.shape)} without its last dim")
    vocab = source.shape[-1] if weight is None else weight.shape[0]
    if mask is None:
        mask = torch.ones(targets.shape, dtype=torch.bool, device=targets.device)
    index = mask.nonzero(as_tuple=True)
    chunk = chunk_size or default_chunk_size(vocab, device=source.device, positions=index[0].shape[0])
    logps, entropy, predicted = _VocabChunks.apply(
        source, weight, bias, index, targets[index], temperature, chunk, with_entropy, entropy_grad, with_predicted
    )
    return TokenStats(
        _scatter(logps, index, targets.shape, 0.0),
        _scatter(entropy, index, targets.shape, 0.0) if with_entropy else None,
        _scatter(predicted, index, targets.shape, -1) if with_predicted else None,
    )


def _scatter(values: Tensor, index: tuple[Tensor, ...], shape: torch.Size, fill: float) -> Tensor:
    """``values (N,)`` placed at ``index`` in a tensor of ``shape`` filled with ``fill`` (differentiable)."""
    if len(index) == 1 and values.shape[0] == shape[0]:  # every position of a 1-D shape
        return values
    out = torch.full(shape, fill, dtype=values.dtype, device=values.device)
    return out.index_put(index, values)


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """``F.cross_entropy(F.linear(hidden, weight, bias).float(), labels)`` without forming the logits.

    ``hidden (*S, H)``, ``weight (V, H)``, ``labels (*S)`` already aligned (no shift), ``ignore_index`` positions
    skipped. ``reduction``: "mean" (over non-ignored positions; 0 when there are none), "sum" or "none" (``(*S)``).
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction={reduction!r}: expected 'mean', 'sum' or 'none'.")
    mask = labels != ignore_index
    stats = chunked_token_stats(hidden, labels.clamp(min=0), weight=weight, bias=bias, mask=mask, chunk_size=chunk_size)
    losses = -stats.logps
    if reduction == "none":
        return losses
    total = losses.sum()
    return total if reduction == "sum" else total / mask.sum().clamp(min=1)


# ------------------------------------------------------------------------------------ logits-based helpers
def selective_log_softmax(logits: Tensor, index: Tensor) -> Tensor:
    """``log_softmax(logits).gather(-1, index)`` in the dtype of ``logits``. ``logits: (B, T, V)``, ``index: (B, T)``
    -> ``(B, T)``. Computed chunk by chunk in float32 (`chunked_token_stats`)."""
    return chunked_token_stats(logits, index).logps.to(logits.dtype)


def entropy_from_logits(logits: Tensor, chunk_size: int | None = None) -> Tensor:
    """Exact entropy of ``softmax(logits)``, float32. ``logits: (B, T, V)`` -> ``(B, T)``, no gradient.

    Computed over ``chunk_size`` flattened positions at a time to bound memory.
    """
    with torch.no_grad():
        targets = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
        stats = chunked_token_stats(logits.detach(), targets, with_entropy=True, chunk_size=chunk_size)
    return stats.entropy


def token_logps_and_entropy(
    logits: Tensor, index: Tensor, temperature: float, with_entropy: bool, entropy_grad: bool = False
) -> tuple[Tensor, Tensor | None]:
    """float32 log-probs of ``index`` (and optionally entropies) under ``softmax(logits / temperature)``.

    ``logits: (B, T, V)``, ``index: (B, T)`` -> ``(logps (B, T), entropy (B, T) or None)``. Dividing by the sampling
    temperature makes the log-probs those of the distribution the completions were actually sampled from (as TRL).
    ``entropy_grad``: keep the entropy in the autograd graph (for an entropy bonus in the loss).
    """
    stats = chunked_token_stats(
        logits, index, temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad
    )
    return stats.logps, stats.entropy


def log_probs_at(
    logits: Tensor,
    sources: Tensor,
    targets: Tensor,
    rows: Tensor | None = None,
    *,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """``log_softmax(logits)[rows[b], sources[b, t], targets[b, t]]``: log-probs of tokens whose predicting
    positions are not simply "the previous one" (e.g. prefix-shared rows, `replayrl.data.prefix_sharing`).

    ``logits: (R, L, V)`` (or with ``weight (V, H)``/``bias`` the hidden states ``(R, L, H)``), ``sources,
    targets: (B, T)``, ``rows: (B,)`` the logits row of each index row (None: ``R == B``, row b) -> float32
    ``(B, T)``. Chunk by chunk: no ``(B, T, V)`` copy of the logits is made, and a position predicting several
    tokens gets the sum of their gradients.
    """
    if rows is None:
        rows = torch.arange(logits.shape[0], device=logits.device)
    index = (rows[:, None].expand_as(sources).reshape(-1), sources.reshape(-1))
    vocab = logits.shape[-1] if weight is None else weight.shape[0]
    chunk = default_chunk_size(vocab, device=logits.device, positions=index[0].shape[0])
    logps, _, _ = _VocabChunks.apply(logits, weight, bias, index, targets.reshape(-1), 1.0, chunk, False, False, False)
    return logps.reshape(sources.shape)


@torch.no_grad()
def chunked_logit_reduce(
    source: Tensor,
    reduce: Callable[[Tensor], Tensor],
    *,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    mask: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """``reduce`` over the float32 logits of each position, chunk by chunk, without gradient (metrics).

    ``source``: logits ``(*S, V)`` or with ``weight (V, H)``/``bias`` hidden states ``(*S, H)``; ``reduce``: float32
    ``(c, V) -> (c,)``; ``mask``: bool ``(*S)``, the positions to compute (None: all) -> float32 ``(*S)``, 0 elsewhere.
    """
    shape = source.shape[:-1]
    if mask is None:
        mask = torch.ones(shape, dtype=torch.bool, device=source.device)
    index = mask.nonzero(as_tuple=True)
    n = index[0].shape[0]
    vocab = source.shape[-1] if weight is None else weight.shape[0]
    chunk = chunk_size or default_chunk_size(vocab, device=source.device, positions=n)
    values = torch.empty(n, dtype=_compute_dtype(source), device=source.device)
    for start in range(0, n, chunk):
        sl = slice(start, start + chunk)
        values[sl] = reduce(_chunk_logits(source, weight, bias, index, sl, 1.0))
    return torch.zeros(shape, dtype=values.dtype, device=values.device).index_put(index, values)


@torch.no_grad()
def mean_logits(
    source: Tensor, *, weight: Tensor | None = None, bias: Tensor | None = None, mask: Tensor | None = None
) -> Tensor:
    """Mean over the vocabulary of each position's logits, float32 ``(*S)``, no gradient. From hidden states it is
    ``hidden @ weight.mean(0) + bias.mean()`` (the mean of a linear map): no pass over the vocabulary at all."""
    if weight is None:
        return chunked_logit_reduce(source, lambda z: z.mean(-1), mask=mask)
    out = source.float() @ weight.float().mean(0) + (bias.float().mean() if bias is not None else 0.0)
    return out if mask is None else out * mask
