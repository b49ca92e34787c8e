"""Token log-probs and entropies from logits without materialising a full ``(B, T, V)`` log-prob tensor.

With vocabularies of ~150k entries the log-softmax of a whole batch is often the largest tensor of the step, so
everything here works row by row (or chunk by chunk).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def selective_log_softmax(logits: Tensor, index: Tensor) -> Tensor:
    """``log_softmax(logits).gather(-1, index)``. ``logits: (B, T, V)``, ``index: (B, T)`` -> ``(B, T)``.

    float32/float64 use ``gathered logit - logsumexp`` one row at a time; bf16/fp16 lose too much precision in that
    subtraction, so they take a per-row ``log_softmax`` instead (same trick as TRL).
    """
    if logits.dtype in (torch.float32, torch.float64):
        selected = logits.gather(-1, index.unsqueeze(-1)).squeeze(-1)
        logsumexp = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
        return selected - logsumexp
    rows = [
        F.log_softmax(row_logits, dim=-1).gather(-1, row_index.unsqueeze(-1)).squeeze(-1)
        for row_logits, row_index in zip(logits, index)
    ]
    return torch.stack(rows)


def entropy_from_logits(logits: Tensor, chunk_size: int = 128) -> Tensor:
    """Exact entropy of ``softmax(logits)``. ``logits: (B, T, V)`` -> ``(B, T)``.

    Computed over ``chunk_size`` flattened positions at a time to bound memory.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    chunks = []
    for chunk in flat.split(chunk_size, dim=0):
        logps = F.log_softmax(chunk, dim=-1)
        # p * log p is 0 * -inf = NaN for masked (-inf) logits; its limit is 0.
        plogp = torch.where(logps > -torch.inf, logps.exp() * logps, 0)
        chunks.append(-plogp.sum(-1))
    return torch.cat(chunks).reshape(logits.shape[:-1])


def token_logps_and_entropy(
    logits: Tensor, index: Tensor, temperature: float, with_entropy: bool, entropy_grad: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Log-probs of ``index`` (and optionally entropies) under ``softmax(logits / temperature)``.

    ``logits: (B, T, V)``, ``index: (B, T)`` -> ``(logps (B, T), entropy (B, T) or None)``. Dividing by the sampling
    temperature makes the log-probs those of the distribution the completions were actually sampled from (as TRL).
    ``entropy_grad``: keep the entropy in the autograd graph (for an entropy bonus in the loss).
    """
    if temperature != 1.0:
        logits = logits / temperature
    logps = selective_log_softmax(logits, index)
    if not with_entropy:
        return logps, None
    if entropy_grad:
        return logps, entropy_from_logits(logits)
    with torch.no_grad():  # a logged metric: without this, backward keeps ~4x the logits alive for nothing
        return logps, entropy_from_logits(logits.detach())


def log_probs_at(logits: Tensor, sources: Tensor, targets: Tensor, rows: Tensor | None = None) -> Tensor:
    """``log_softmax(logits)[rows[b], sources[b, t], targets[b, t]]``: log-probs of tokens whose predicting
    positions are not simply "the previous one" (e.g. prefix-shared rows, `replayrl.data.prefix_sharing`).

    ``logits: (R, L, V)``, ``sources, targets: (B, T)``, ``rows: (B,)`` the logits row of each index row (None:
    ``R == B``, row b) -> float32 ``(B, T)``. A logsumexp per position, row by row in float32, and one gathered
    logit per token: no ``(B, T, V)`` copy of the logits is made.
    """
    if rows is None:
        rows = torch.arange(logits.shape[0], device=logits.device)
    logsumexp = torch.stack([torch.logsumexp(row.float(), dim=-1) for row in logits])  # (R, L)
    return logits[rows[:, None], sources, targets].float() - logsumexp[rows[:, None], sources]
