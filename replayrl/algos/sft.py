"""Supervised fine-tuning losses over token log-probs (torch only).

- `nll`: the usual negative log-likelihood of the label token, `-log p_t`.
- `dft`: Dynamic Fine-Tuning (Wu et al., "On the Generalization of SFT: A Reinforcement Learning Perspective
  with Reward Rectification", arXiv 2508.05629): each token's NLL weighted by its own probability with the
  gradient stopped, `-sg(p_t) * log p_t`, which undoes the implicit 1/p_t weight of the SFT gradient.

Both are summed over the trained tokens and divided by `num_items`, the trained-token count of the WHOLE
accumulated batch (all gradient-accumulation micro-batches, all processes), so the update is the same however
the batch is split.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from replayrl.algos.logprobs import TokenStats, chunked_token_stats

SFTLossType = Literal["nll", "dft"]
SFT_LOSS_TYPES = ("nll", "dft")


def nll_token_loss(token_logps: Tensor) -> Tensor:
    """`-log p_t`. `token_logps: (B, T)` -> `(B, T)`."""
    return -token_logps


def dft_token_loss(token_logps: Tensor) -> Tensor:
    """`-sg(p_t) * log p_t` (arXiv 2508.05629, eq. 9). `token_logps: (B, T)` -> `(B, T)`.

    Its value is `-p log p`; its gradient w.r.t. `log p` is `-p` (the probability is a constant weight).
    """
    return -token_logps.detach().exp() * token_logps


def sft_token_loss(token_logps: Tensor, loss_type: SFTLossType = "nll") -> Tensor:
    if loss_type == "nll":
        return nll_token_loss(token_logps)
    if loss_type == "dft":
        return dft_token_loss(token_logps)
    raise ValueError(f"loss_type={loss_type!r}: expected one of {SFT_LOSS_TYPES}.")


def token_sum_loss(per_token: Tensor, mask: Tensor, num_items: Tensor | int | float | None = None) -> Tensor:
    """`sum(per_token * mask) / num_items`; `num_items` defaults to `mask.sum()` (this micro-batch alone).

    `per_token, mask: (B, T)` -> scalar. With no trained token the result is 0 (not NaN) and still carries a
    gradient graph, so every process takes part in the backward pass.
    """
    total = (per_token * mask).sum()
    if num_items is None:
        num_items = mask.sum()
    if isinstance(num_items, Tensor):  # no .item(): no host sync per micro-batch
        return total / num_items.to(total.device, total.dtype).clamp(min=1)
    return total / (num_items if num_items > 0 else 1)


def trained_token_stats(
    logits: Tensor, labels: Tensor, mask: Tensor, chunk_size: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(correct, entropy_sum, count) over the trained tokens, without autograd.

    `logits: (B, T, V)` already aligned with `labels: (B, T)`; `mask: (B, T)` bool. `correct`: trained tokens whose
    argmax prediction is the label; `entropy_sum`: summed entropy (nats) of the predicted distributions; `count`:
    trained tokens. Chunk by chunk (`chunked_token_stats`), so no (N, V) copy of the logits is made.
    """
    with torch.no_grad():
        stats = chunked_token_stats(
            logits.detach(),
            labels.clamp(min=0),
            mask=mask,
            with_entropy=True,
            with_predicted=True,
            chunk_size=chunk_size,
        )
        return token_stats_sums(stats, labels, mask)


def token_stats_sums(stats: TokenStats, labels: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(correct, entropy_sum, count) of `chunked_token_stats` results over the positions of `mask`. `labels, mask:
    (B, T)`. `correct`: long, `entropy_sum`: float32, `count`: long."""
    with torch.no_grad():
        correct = ((stats.predicted == labels) & mask).sum()
        entropy = (stats.entropy.float() * mask).sum()
        return correct, entropy, mask.sum()
