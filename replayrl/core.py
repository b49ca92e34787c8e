"""TRL v0.7.1's `trl.core` helpers that its PPO users import: `respond_to_batch`, `LengthSampler`, `set_seed`.

`from trl.core import LengthSampler, respond_to_batch` becomes `from replayrl.core import ...`.
"""

from __future__ import annotations

import torch
from transformers.trainer_utils import set_seed

from replayrl.ppo.trainer import LengthSampler

__all__ = ["LengthSampler", "respond_to_batch", "set_seed"]


@torch.no_grad()
def respond_to_batch(model, queries: torch.Tensor, txt_len: int = 20, top_k: int = 0, top_p: float = 1.0):
    """Sample exactly ``txt_len`` tokens after ``queries (B, L)`` with ``model`` (a value-head wrapper or a causal
    LM; no KV cache, no stop at EOS), top-k / nucleus filtered as TRL v0.7.1's helper; returns ``(B, txt_len)``."""
    input_ids = queries
    for _ in range(txt_len):
        outputs = model(input_ids)
        logits = (outputs[0] if isinstance(outputs, tuple) else outputs.logits)[:, -1, :].float()
        probs = torch.softmax(_top_k_top_p(logits, top_k, top_p), dim=-1)
        next_token = torch.multinomial(probs, num_samples=1)
        input_ids = torch.cat([input_ids, next_token], dim=-1)
    return input_ids[:, -txt_len:]


def _top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``logits (B, V)`` with all but the ``top_k`` largest (0: no limit) and those outside the smallest set of
    probability >= ``top_p`` set to -inf (the most likely token is always kept)."""
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(ordered, dim=-1) >= top_p  # mass before this token already reaches top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits
