"""Generalised Jensen-Shannon divergence between a student's and a teacher's next-token distributions (GKD,
arXiv:2306.13649), as TRL 1.16's DistillationTrainer defines it, computed chunk by chunk over positions.

With ``p_s`` and ``p_t`` the student's and teacher's distributions at one position (softmax of logits / temperature)
and the mixture ``m = (1 - beta) p_s + beta p_t``:
  beta = 0: forward KL(p_t || p_s);  beta = 1: reverse KL(p_s || p_t);
  else:     JSD_beta = beta * KL(p_t || m) + (1 - beta) * KL(p_s || m).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from replayrl.algos.logprobs import _compute_dtype, _log_softmax_and_softmax


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


def _rowdot(a: Tensor, b: Tensor) -> Tensor:
    """``(a * b).sum(-1)`` for ``(c, V)`` without a ``(c, V)`` temporary."""
    return torch.einsum("cv,cv->c", a, b)


def jsd_value_and_grad(
    student_logits: Tensor, teacher_logits: Tensor, beta: float, temperature: float, want_grad: bool
) -> tuple[Tensor, Tensor | None]:
    """`generalized_jsd` of one chunk ``(c,)`` and, with ``want_grad``, its gradient w.r.t. the student's logits
    ``(c, V)`` in closed form. Both logits are float ``(c, V)`` buffers and are overwritten.

    With ``s = log p_s``, ``t = log p_t``, ``u = logits / temperature`` (gradients w.r.t. ``u``, divided by the
    temperature at the end):
      beta 0 (KL(p_t || p_s)):  d/du = p_s - p_t
      beta 1 (KL(p_s || p_t)):  d/du = p_s * (s - t - KL(p_s || p_t))
      else:  d JSD / d p_s = (1 - beta)(s - log m), so d/du = (1 - beta) p_s * (s - log m - KL(p_s || m)).
    """
    if temperature != 1.0:
        student_logits /= temperature
        teacher_logits /= temperature
    # the teacher first: its softmax's scratch buffer is freed before the student's two buffers exist (beta 1 then
    # peaks at three (c, V) buffers, not four)
    log_pt, p_t = _log_softmax_and_softmax(teacher_logits)
    if beta == 1.0:
        del p_t
    log_ps, p_s = _log_softmax_and_softmax(student_logits)
    if beta == 0.0:
        value = _rowdot(p_t, log_pt.sub_(log_ps))
        grad = p_s.sub_(p_t) if want_grad else None
    elif beta == 1.0:
        diff = log_pt.neg_().add_(log_ps)  # s - t
        value = _rowdot(p_s, diff)
        grad = diff.sub_(value[:, None]).mul_(p_s) if want_grad else None
    else:
        log_m = torch.add(log_ps, math.log(1 - beta))
        torch.logaddexp(log_m, log_pt.add_(math.log(beta)), out=log_m)
        kl_t = _rowdot(p_t, log_pt.sub_(math.log(beta)).sub_(log_m))
        del p_t, log_pt
        diff = log_ps.sub_(log_m)  # s - log m
        kl_s = _rowdot(p_s, diff)
        value = beta * kl_t + (1 - beta) * kl_s
        grad = diff.sub_(kl_s[:, None]).mul_(p_s).mul_(1 - beta) if want_grad else None
    if grad is not None and temperature != 1.0:
        grad /= temperature
    return value, grad


class _Head(NamedTuple):
    """One model's lm_head input ``source`` (N, H) with ``weight`` (V, H) / ``bias``, or logits (N, V) alone."""

    source: Tensor
    weight: Tensor | None
    bias: Tensor | None

    def logits(self, sl: slice, dtype: torch.dtype) -> Tensor:
        rows = self.source[sl]
        if self.weight is None:
            return rows.to(dtype, copy=True)  # a private float buffer: the divergence overwrites it
        return F.linear(rows, self.weight, self.bias).to(dtype)  # fresh already


class _Grads:
    """Gradient buffers of the student's head, filled chunk by chunk from the gradients w.r.t. its logits."""

    def __init__(self, head: _Head, needs: tuple[bool, bool, bool], dtype: torch.dtype):
        self.head = head
        src, w, b = head
        self.source = torch.zeros(src.shape, dtype=dtype, device=src.device) if needs[0] else None
        self.weight = torch.zeros_like(w) if w is not None and needs[1] else None
        self.bias = torch.zeros(b.shape, dtype=dtype, device=b.device) if b is not None and needs[2] else None

    def add(self, grad: Tensor, sl: slice) -> None:
        """Adds the chunk ``sl``'s gradient w.r.t. its logits ``(c, V)`` (float, consumed)."""
        src, w, _ = self.head
        if w is None:
            if self.source is not None:
                self.source[sl] += grad
            return
        if self.bias is not None:
            self.bias += grad.sum(0)
        grad = grad.to(w.dtype)
        if self.source is not None:
            self.source[sl] += grad @ w
        if self.weight is not None:
            self.weight.addmm_(grad.T, src[sl].to(w.dtype))

    def results(self, scale: Tensor | None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """The buffers times ``scale`` (a 0-d tensor; None: as they are), in the head's dtypes; scaled in place, so
        that the weight's ``(V, H)`` gradient is never held twice."""
        src, w, b = self.head
        out = []
        for grad, like in ((self.source, src), (self.weight, w), (self.bias, b)):
            if grad is not None:
                grad = grad.mul_(scale.to(grad.dtype)) if scale is not None else grad
                grad = grad.to(like.dtype)
            out.append(grad)
        self.source = self.weight = self.bias = None
        return tuple(out)


def _run_chunks(student: _Head, teacher: _Head, settings: tuple, grads: _Grads | None, row_scale: Tensor | None):
    """The divergence ``(N,)``; with ``grads``, adds each chunk's gradient (rows times ``row_scale`` if given)."""
    beta, temperature, chunk = settings
    n = student.source.shape[0]
    dtype = _compute_dtype(student.source)
    values = torch.empty(n, dtype=dtype, device=student.source.device)
    for start in range(0, n, chunk):
        sl = slice(start, start + chunk)
        value, grad = jsd_value_and_grad(
            student.logits(sl, dtype), teacher.logits(sl, dtype), beta, temperature, grads is not None
        )
        values[sl] = value
        if grads is not None:
            if row_scale is not None:
                grad *= row_scale[sl, None].to(grad.dtype)
            grads.add(grad, sl)
        del value, grad
    return values


class _JSDChunks(torch.autograd.Function):
    """The divergence at N positions with its gradient formed in the forward pass, chunk by chunk.

    The forward pass adds each chunk's closed-form gradient (for an upstream gradient of 1 at every position) into
    buffers shaped like the student's source, weight and bias, and keeps nothing full-vocabulary. The backward pass
    scales them when the upstream gradient is the same at every position (a sum or mean of the divergences, the
    trainer's loss); otherwise it recomputes the chunks with the per-position upstream gradient.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, s_src, s_w, s_b, t_src, t_w, t_b, beta, temperature, chunk):
        student, teacher = _Head(s_src, s_w, s_b), _Head(t_src, t_w, t_b)
        needs = tuple(ctx.needs_input_grad[:3])
        grads = _Grads(student, needs, _compute_dtype(s_src)) if any(needs) else None
        values = _run_chunks(student, teacher, (beta, temperature, chunk), grads, None)
        ctx.grads = grads
        ctx.settings = (beta, temperature, chunk)
        ctx.save_for_backward(s_src, s_w, s_b, t_src, t_w, t_b)
        return values

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_values):
        grads, ctx.grads = ctx.grads, None
        tail = (None,) * 6
        if grad_values.numel() == 0 or bool((grad_values == grad_values[0]).all()):
            return (*grads.results(grad_values[0] if grad_values.numel() else None), *tail)
        s_src, s_w, s_b, t_src, t_w, t_b = ctx.saved_tensors
        student = _Head(s_src, s_w, s_b)
        fresh = _Grads(student, tuple(ctx.needs_input_grad[:3]), _compute_dtype(s_src))
        del grads
        _run_chunks(student, _Head(t_src, t_w, t_b), ctx.settings, fresh, grad_values)
        return (*fresh.results(None), *tail)


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
    differ in H, not in V). The gradient w.r.t. the student's logits is formed in closed form during the forward pass
    (`jsd_value_and_grad`) and projected at once onto the student's source, weight and bias, so neither pass keeps a
    ``(N, V)`` tensor and nothing is recomputed when the upstream gradient is uniform (a sum or mean of the result).
    Gradients flow to the student only; the teacher is scored without a graph. Returns ``(N,)`` float32 (float64
    for float64 inputs).
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1] (got {beta}): 0 forward KL, 1 reverse KL, between: JSD.")
    n = student[0].shape[0]
    if teacher[0].shape[0] != n:
        raise ValueError(f"student and teacher give {n} and {teacher[0].shape[0]} positions; they must match.")
    t_src, t_w, t_b = (x.detach() if x is not None else None for x in teacher)
    if t_w is not None and t_w.dtype != t_src.dtype:  # one cast for all chunks, not one per chunk
        t_w, t_b = t_w.to(t_src.dtype), t_b.to(t_src.dtype) if t_b is not None else None
    s_src, s_w, s_b = student
    if s_w is not None and s_w.dtype != s_src.dtype:
        s_src = s_src.to(s_w.dtype)
    return _JSDChunks.apply(s_src, s_w, s_b, t_src, t_w, t_b, beta, temperature, max(1, chunk_size))
