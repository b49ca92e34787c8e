"""Queries + responses -> one padded batch, and the forward pass that gives per-response-token log-probs/values.

Layout of a batch of B samples: ``[left-padded query (Q) | right-padded response (R)]``, so every response starts
at column Q and every per-token tensor is ``(B, R)`` over response tokens. ``position_ids`` count real tokens
only (``cumsum(attention_mask) - 1``, what ``generate`` uses for left-padded prompts), so padding changes neither
log-probs nor values (tested). Log-prob and value of response token t are read at column ``Q - 1 + t``: the
state before the token is sampled (as TRL v0.7.1).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor

from replayrl.models.lm_head import forward_to_head


@dataclass
class PPOBatch:
    """``input_ids, attention_mask, position_ids: (B, Q + R)``; ``response_mask: (B, R)`` (padding and the
    user's ``response_masks`` combined); ``query_width`` = Q."""

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    response_mask: Tensor
    query_width: int

    def select(self, rows: Tensor) -> PPOBatch:
        """The rows ``rows``, with columns that are padding in all of them dropped (cheaper; same results)."""
        attention = self.attention_mask[rows]
        query_start = int(attention[:, : self.query_width].any(0).int().argmax())
        response_width = int(attention[:, self.query_width :].any(0).nonzero().max()) + 1
        cols = slice(query_start, self.query_width + response_width)
        return PPOBatch(
            input_ids=self.input_ids[rows, cols],
            attention_mask=attention[:, cols],
            position_ids=self.position_ids[rows, cols],
            response_mask=self.response_mask[rows, :response_width],
            query_width=self.query_width - query_start,
        )


def build_batch(
    queries: list[Tensor], responses: list[Tensor], pad_token_id: int, response_masks: list[Tensor] | None = None
) -> PPOBatch:
    """``queries[i]: (Lq_i,)``, ``responses[i]: (Lr_i,)`` token ids, ``response_masks[i]: (Lr_i,)`` 0/1."""
    q_width, r_width = max(len(q) for q in queries), max(len(r) for r in responses)
    rows, masks, response_mask = [], [], []
    for i, (query, response) in enumerate(zip(queries, responses)):
        q_pad, r_pad = q_width - len(query), r_width - len(response)
        rows.append(
            F.pad(torch.cat([F.pad(query, (q_pad, 0), value=pad_token_id), response]), (0, r_pad), value=pad_token_id)
        )
        masks.append(torch.cat([torch.zeros(q_pad), torch.ones(len(query) + len(response)), torch.zeros(r_pad)]))
        mask = torch.ones(len(response)) if response_masks is None else response_masks[i].float().cpu()
        response_mask.append(F.pad(mask, (0, r_pad)))
    input_ids = torch.stack(rows).long()
    attention_mask = torch.stack(masks).long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return PPOBatch(input_ids, attention_mask, position_ids, torch.stack(response_mask), q_width)


def batch_to(batch, device: torch.device):
    """`batch` (a `PPOBatch` or an encoder-decoder `Seq2SeqPPOBatch`) with its tensors on `device`."""
    return type(batch)(**{f.name: _to(getattr(batch, f.name), device) for f in fields(batch)})


def _to(value, device):
    return value.to(device) if isinstance(value, Tensor) else value


@dataclass
class ForwardOutput:
    """``logprobs, values: (B, R)``; ``full_logprobs: (B, R, V)`` or None; ``entropy: (B, R)`` or None."""

    logprobs: Tensor
    values: Tensor | None
    full_logprobs: Tensor | None = None
    entropy: Tensor | None = None
    logits: Tensor | None = None  # (B, R, V) response-position logits (already computed), when asked


def forward(
    model,
    batch: PPOBatch,
    temperature: float = 1.0,
    full_logprobs: bool = False,
    entropy: bool = False,
    keep_logits: bool = False,
) -> ForwardOutput:
    """One forward pass of ``model`` (value-head wrapper: values too; plain LM: values None) over ``batch``.

    Logits are divided by the sampling ``temperature`` (arXiv:2403.17031) so the log-probs are those of the
    distribution the responses were sampled from. The lm_head is applied chunk by chunk to the response positions
    (`replayrl.models.lm_head`); only ``full_logprobs`` and ``keep_logits`` form full-vocabulary tensors. An
    encoder-decoder batch (`replayrl.ppo.seq2seq_batch`) goes to its own forward.
    """
    if hasattr(batch, "decoder_input_ids"):
        from replayrl.ppo.seq2seq_batch import seq2seq_forward

        return seq2seq_forward(model, batch, temperature, full_logprobs, entropy, keep_logits)
    out, head = forward_to_head(
        model, input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    )
    values = out[2] if isinstance(out, tuple) else None
    start, width = batch.query_width - 1, batch.response_mask.shape[1]
    head = head.positions(slice(start, start + width))
    targets = batch.input_ids[:, start + 1 : start + 1 + width]
    stats = head.token_stats(targets, temperature=temperature, with_entropy=entropy)
    result = ForwardOutput(stats.logps, None, entropy=stats.entropy)
    if values is not None:
        result.values = values[:, start : start + width]
    if full_logprobs or keep_logits:  # the exact-KL option and TRL v0.7.1's `loss(..., logits, ...)` hook ask for them
        with torch.set_grad_enabled(torch.is_grad_enabled() and full_logprobs):  # the hook's logits: a stat only
            logits = head.source if head.weight is None else F.linear(head.source, head.weight, head.bias)
            logits = logits.float() / temperature
        result.full_logprobs = F.log_softmax(logits, dim=-1) if full_logprobs else None
        result.logits = logits if keep_logits else None
    return result


@torch.no_grad()
def batched_forward(model, batch, chunk: int, temperature: float, full_logprobs: bool) -> ForwardOutput:
    """`forward` in chunks of ``chunk`` rows (TRL v0.7.1's mini_batch_size), without gradients; padded back to R."""
    n, width = batch.input_ids.shape[0], batch.response_mask.shape[1]
    parts = []
    for start in range(0, n, chunk):
        rows = torch.arange(start, min(start + chunk, n), device=batch.input_ids.device)
        parts.append(forward(model, batch.select(rows), temperature, full_logprobs))

    def cat(name: str) -> Tensor | None:
        tensors = [getattr(p, name) for p in parts]
        if tensors[0] is None:
            return None
        # pad the response dimension (dim 1) back to the full width R
        return torch.cat([F.pad(t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1])) for t in tensors])

    return ForwardOutput(cat("logprobs"), cat("values"), cat("full_logprobs"))
