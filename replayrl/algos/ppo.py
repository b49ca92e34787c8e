"""PPO with a value head for language models (arXiv:1707.06347; RLHF as in arXiv:1909.08593), pure tensor math.

The layout follows TRL v0.7.1's `PPOTrainer`: rewards are per response token, ``-beta * KL_t`` at every
token plus the scalar score on the last one; advantages come from GAE (arXiv:1506.02438) over the response tokens,
whitened; the loss is the clipped surrogate plus a clipped value loss. Implementation choices where TRL v0.7.1 is
silent follow "The N+ Implementation Details of RLHF with PPO" (arXiv:2403.17031); see docs/ppo.md.

Every tensor here is ``(B, T)`` over response tokens with a 0/1 ``mask`` of the same shape, unless stated.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from replayrl.algos.losses import masked_mean

KLPenalty = Literal["kl", "abs", "mse", "full"]
KL_PENALTIES = ("kl", "abs", "mse", "full")


# ---------------------------------------------------------------------------------------------- masked statistics
# masked_mean (0 for an empty mask, optionally along an axis) is `algos.losses.masked_mean`, shared with GRPO.
def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``values`` where ``mask`` is 1, with Bessel's correction n / (n - 1) as in TRL v0.7.1.

    Raises ValueError for an empty mask, and (unbiased) for a single element, where the variance is undefined.
    """
    n = mask.sum()
    if n == 0:
        raise ValueError("masked_var: the mask is empty; there is nothing to compute a variance of.")
    variance = masked_mean((values - masked_mean(values, mask)) ** 2, mask)
    if unbiased:
        if n == 1:
            raise ValueError(
                "masked_var: the mask has a single element, so the unbiased variance is undefined; "
                "use more than one response token per batch (or unbiased=False)."
            )
        variance = variance * n / (n - 1)
    return variance


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True, reduce_sum=None) -> Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` with masked statistics (unbiased var); ``shift_mean=False`` keeps
    the mean. ``reduce_sum`` (e.g. a sum over data-parallel processes) makes the statistics those of the whole
    batch across processes; None: this tensor's own."""
    if reduce_sum is None:
        mean, var = masked_mean(values, mask), masked_var(values, mask)
    else:
        mask_f = mask.to(values.dtype)
        n = reduce_sum(mask_f.sum())
        if n < 2:
            raise ValueError(f"masked_whiten: {int(n)} unmasked value(s) in the batch; the variance needs two.")
        mean = reduce_sum((values * mask_f).sum()) / n
        var = reduce_sum(((values - mean).square() * mask_f).sum()) / (n - 1)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


# ---------------------------------------------------------------------------------------------- KL penalty
def kl_penalty(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    kind: KLPenalty = "kl",
    full_logprobs: Tensor | None = None,
    full_ref_logprobs: Tensor | None = None,
) -> Tensor:
    """Per-token KL penalty between the policy and the reference at the sampled tokens.

    ``"kl"``: logp - ref (k1, unbiased); ``"abs"``: |logp - ref|; ``"mse"``: (logp - ref)^2 / 2; ``"full"``: the
    exact KL(pi || pi_ref) over the vocabulary, from ``full_logprobs, full_ref_logprobs: (B, T, V)``
    (log-softmaxed). Returns ``(B, T)``.
    """
    if kind == "kl":
        return logprobs - ref_logprobs
    if kind == "abs":
        return (logprobs - ref_logprobs).abs()
    if kind == "mse":
        return 0.5 * (logprobs - ref_logprobs).square()
    if kind == "full":
        if full_logprobs is None or full_ref_logprobs is None:
            raise ValueError("kl_penalty='full' needs the full log-prob distributions (B, T, V) of both models.")
        # kl_div(input=ref, target=pi, log_target=True) = sum_v pi_v (log pi_v - log ref_v) = KL(pi || ref)
        return F.kl_div(full_ref_logprobs, full_logprobs, log_target=True, reduction="none").sum(-1)
    raise ValueError(f"unknown kl_penalty {kind!r}; expected one of {', '.join(KL_PENALTIES)}")


class AdaptiveKLController:
    """Adaptive KL coefficient (arXiv:1909.08593, section 2.2): steers the measured KL towards ``target``.

    ``beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon)``.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        self.value, self.target, self.horizon = float(init_kl_coef), float(target), float(horizon)

    def update(self, current: float, n_steps: int) -> None:
        proportional_error = min(max(float(current) / self.target - 1, -0.2), 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.target, self.horizon = float(state["value"]), float(state["target"]), float(state["horizon"])


class FixedKLController:
    """A constant KL coefficient; ``update`` does nothing."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class RunningMoments:
    """Running mean and (unbiased) std of all scores seen so far (Chan et al.'s parallel update), used by
    ``use_score_scaling``. ``update(xs: (N,))`` returns the batch's own mean and std."""

    def __init__(self):
        self.mean, self.std, self.var, self.count = 0.0, 1.0, 1.0, 1e-24

    def update(self, xs: Tensor) -> tuple[float, float]:
        xs = xs.double()
        xs_count = xs.numel()
        xs_var, xs_mean = torch.var_mean(xs, unbiased=False)
        xs_mean, xs_var = xs_mean.item(), xs_var.item()
        delta = xs_mean - self.mean
        total = self.count + xs_count
        new_sum = xs_var * xs_count
        old_sum = self.var * self.count + delta**2 * self.count * xs_count / total
        self.mean += delta * xs_count / total
        self.var = (new_sum + old_sum) / total
        self.std = math.sqrt(self.var * total / max(total - 1, 1e-24))
        self.count = total
        return xs_mean, math.sqrt(xs_var * xs_count / max(xs_count - 1, 1))

    def state_dict(self) -> dict:
        return {"mean": self.mean, "std": self.std, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.std, self.var, self.count = (float(state[k]) for k in ("mean", "std", "var", "count"))


# ---------------------------------------------------------------------------------------------- rewards, GAE
def last_token_index(mask: Tensor) -> Tensor:
    """Index of the last 1 in each row of ``mask: (B, T)`` -> ``(B,)``; raises for an all-zero row."""
    if (mask.sum(-1) == 0).any():
        raise ValueError("a response has no unmasked token; every response needs at least one token to score.")
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).amax(-1)


def token_rewards(scores: Tensor, kl: Tensor, kl_coef: float, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per-token rewards ``r_t = -kl_coef * KL_t``, plus the score on the last unmasked token of each row.

    ``scores: (B,)``, ``kl, mask: (B, T)``. Returns ``(rewards (B, T), non_score_rewards (B, T))``; both are 0 at
    masked positions.
    """
    mask = mask.to(kl.dtype)
    non_score = -kl_coef * kl * mask
    rewards = non_score.clone()
    rows = torch.arange(kl.shape[0], device=kl.device)
    rewards[rows, last_token_index(mask)] += scores.to(kl.dtype)
    return rewards, non_score


def gae_reference(values: Tensor, rewards: Tensor, mask: Tensor, gamma: float, lam: float) -> Tensor:
    """GAE advantages, the obviously-correct loop (TRL v0.7.1's): ``delta_t = r_t + gamma V_{t+1} - V_t``,
    ``A_t = delta_t + gamma lam A_{t+1}``, with ``V_T = 0`` and values/rewards zeroed where ``mask`` is 0."""
    values, rewards = values * mask, rewards * mask
    length = rewards.shape[-1]
    last, reversed_advantages = torch.zeros_like(values[:, 0]), []
    for t in reversed(range(length)):
        next_value = values[:, t + 1] if t < length - 1 else torch.zeros_like(values[:, t])
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        reversed_advantages.append(last)
    return torch.stack(reversed_advantages[::-1], dim=1)


def gae(values: Tensor, rewards: Tensor, mask: Tensor, gamma: float, lam: float) -> Tensor:
    """GAE advantages, vectorised: ``A_t = sum_{s >= t} (gamma lam)^(s - t) delta_s`` as one matrix product.

    Same inputs and result as `gae_reference` (tested equal); ``(B, T)`` -> ``(B, T)``. The ``(T, T)`` discount
    matrix is cheap for response lengths (T of a few thousand at most).
    """
    mask = mask.to(values.dtype)
    values, rewards = values * mask, rewards * mask
    next_values = F.pad(values[:, 1:], (0, 1))
    deltas = rewards + gamma * next_values - values
    t = torch.arange(values.shape[-1], device=values.device)
    offset = (t.unsqueeze(0) - t.unsqueeze(1)).to(values.dtype)  # offset[t, s] = s - t
    discount = torch.where(
        offset >= 0, torch.pow(torch.tensor(gamma * lam, dtype=values.dtype), offset.clamp(min=0)), 0
    )
    return deltas @ discount.T


def advantages_and_returns(
    values: Tensor, rewards: Tensor, mask: Tensor, gamma: float, lam: float, whiten: bool = True, reduce_sum=None
) -> tuple[Tensor, Tensor]:
    """``(advantages, returns)``, both ``(B, T)`` and detached: returns = raw GAE + values (the value target);
    advantages whitened over the batch's unmasked tokens (as TRL v0.7.1; ``reduce_sum``: see `masked_whiten`)."""
    advantages = gae(values, rewards, mask, gamma, lam)
    returns = advantages + values * mask.to(values.dtype)
    if whiten:
        advantages = masked_whiten(advantages, mask, reduce_sum=reduce_sum)
    return advantages.detach(), returns.detach()


# ---------------------------------------------------------------------------------------------- losses
def _token_mean(values: Tensor, mask: Tensor, num_tokens: float | Tensor | None) -> Tensor:
    """``sum(values * mask) / num_tokens``; ``num_tokens`` defaults to the mask's count (a masked mean).

    Passing the token count of the whole mini-batch over all processes, times the number of processes, makes the
    data-parallel average of the per-process losses equal the loss of the whole mini-batch on one process.
    """
    if num_tokens is None:
        return masked_mean(values, mask)
    return (values * mask.to(values.dtype)).sum() / num_tokens


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cliprange: float,
    num_tokens: float | Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Clipped surrogate ``mean(max(-A r, -A clip(r, 1 - eps, 1 + eps)))`` over unmasked tokens.

    Returns ``(loss (), clipfrac (), ratio (B, T))``; clipfrac is the fraction of tokens where the clipped term wins.
    ``num_tokens``: the mean's denominator (see `_token_mean`).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    losses = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    loss = _token_mean(torch.maximum(losses, clipped), mask, num_tokens)
    clipfrac = masked_mean((clipped > losses).to(logprobs.dtype), mask)
    return loss, clipfrac, ratio


def value_loss(
    vpreds: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    cliprange_value: float,
    vf_coef: float,
    num_tokens: float | Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``vf_coef * 0.5 * mean(max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2))`` over unmasked tokens.

    Returns ``(weighted loss (), clipfrac ())``. ``num_tokens``: the mean's denominator (see `_token_mean`).
    """
    vclipped = torch.clamp(vpreds, old_values - cliprange_value, old_values + cliprange_value)
    losses, clipped = (vpreds - returns).square(), (vclipped - returns).square()
    loss = 0.5 * _token_mean(torch.maximum(losses, clipped), mask, num_tokens)
    clipfrac = masked_mean((clipped > losses).to(vpreds.dtype), mask)
    return vf_coef * loss, clipfrac


def approx_kl(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(approxkl, policykl)``: ``0.5 * mean((logp - old)^2)`` and ``mean(old - logp)`` over unmasked tokens."""
    diff = logprobs - old_logprobs
    return 0.5 * masked_mean(diff.square(), mask), masked_mean(-diff, mask)
