"""Generalised Jensen-Shannon divergence between a student's and a teacher's next-token distributions (GKD,
arXiv:2306.13649), as TRL 1.16's DistillationTrainer defines it, computed chunk by chunk over positions.

With ``p_s`` and ``p_t`` the student's and teacher's distributions at one position (softmax of logits / temperature)
and the mixture ``m = (1 - beta) p_s + beta p_t``:
  beta = 0: forward KL(p_t || p_s);  beta = 1: reverse KL(p_s || p_t);
  else:     JSD_beta = beta * KL(p_t || m) + (1 - beta) * KL(p_s || m).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def generalized_jsd(student_logits: Tensor, teacher_logits: Tensor, beta: float, temperature: float = 1.0) -> Tensor:
    """Per-position divergence ``(*S)`` from logits ``(*S, V)`` (float32 math; the reference implementation)."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1] (got {beta}): 0 forward KL, 1 reverse KL, between: JSD.")
    log_ps = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_pt = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0.0:
        return (log_pt.exp() * (log_pt - log_ps)).sum(-1)
    if beta == 1.0:
        return (log_ps.exp() * (log_ps - log_pt)).sum(-1)
    log_m = torch.logaddexp(log_ps + math.log(1 - beta), log_pt + math.log(beta))
    kl_t = (log_pt.exp() * (log_pt - log_m)).sum(-1)
    kl_s = (log_ps.exp() * (log_ps - log_m)).sum(-1)
    return beta * kl_t + (1 - beta) * kl_s


def _logits(source: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    return source if weight is None else F.linear(source, weight.to(source.dtype), bias)


def _chunk_divergence(s_src, s_w, s_b, t_src, t_w, t_b, beta: float, temperature: float) -> Tensor:
    with torch.no_grad():
        teacher = _logits(t_src, t_w, t_b)
    return generalized_jsd(_logits(s_src, s_w, s_b), teacher, beta, temperature)


def chunked_generalized_jsd(
    student: tuple[Tensor, Tensor | None, Tensor | None],
    teacher: tuple[Tensor, Tensor | None, Tensor | None],
    beta: float,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> Tensor:
    """`generalized_jsd` at ``N`` positions without holding more than one chunk of full-vocabulary logits.

    ``student`` / ``teacher``: ``(source, weight, bias)``, where ``source (N, H)`` are hidden states projected by the
    lm_head ``weight (V, H)`` / ``bias (V,)``, or ``source (N, V)`` are logits with weight and bias None (the two may
    differ in H, not in V). Each chunk of ``chunk_size`` positions is recomputed in the backward pass (activation
    checkpointing), so neither pass keeps a ``(N, V)`` tensor. Gradients flow to the student only. Returns ``(N,)``.
    """
    n = student[0].shape[0]
    if teacher[0].shape[0] != n:
        raise ValueError(f"student and teacher give {n} and {teacher[0].shape[0]} positions; they must match.")
    parts = []
    for start in range(0, n, chunk_size):
        sl = slice(start, start + chunk_size)
        args = (student[0][sl], student[1], student[2], teacher[0][sl], teacher[1], teacher[2], beta, temperature)
        if torch.is_grad_enabled():
            parts.append(checkpoint(_chunk_divergence, *args, use_reentrant=False))
        else:
            parts.append(_chunk_divergence(*args))
    return torch.cat(parts) if parts else student[0].new_zeros(0)
