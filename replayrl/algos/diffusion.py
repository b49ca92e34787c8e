"""DDPO math (arXiv:2305.13301): the DDIM step as a Gaussian policy, per-prompt reward statistics, the PPO loss.

Each DDIM denoising step (arXiv:2010.02502, eq. 12 with sigma_t(eta) of eq. 16) with ``eta > 0`` samples

    x_{t-1} ~ N(mu_theta(x_t, t), sigma_t^2 I)
    mu = sqrt(a_prev) * x0_hat + sqrt(1 - a_prev - sigma_t^2) * eps_hat
    sigma_t = eta * sqrt((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev))

where ``a_t`` is alpha-bar (``alphas_cumprod``) at t and ``a_prev`` at the previous timestep, or the
scheduler's ``final_alpha_cumprod`` after the last step. Its log-density, averaged (not summed) over the latent
dimensions, is the per-step log-prob DDPO uses; the mean sets the scale of the tiny default clip range (1e-4).

Torch only; nothing here knows a scheduler or a config object (`replayrl.ddpo.pipeline` adapts diffusers').
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal

import torch
from torch import Tensor

PredictionType = Literal["epsilon", "sample", "v_prediction"]
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def ddim_alphas(
    alphas_cumprod: Tensor, final_alpha_cumprod: Tensor | float, timesteps: Tensor, prev_timesteps: Tensor
) -> tuple[Tensor, Tensor]:
    """alpha-bar at ``timesteps`` and at ``prev_timesteps`` (``final_alpha_cumprod`` where the latter is < 0).

    ``alphas_cumprod: (num_train_timesteps,)``, ``timesteps, prev_timesteps: (B,)`` int -> two ``(B,)`` tensors.
    """
    alphas_cumprod = alphas_cumprod.to(timesteps.device)
    final = torch.as_tensor(final_alpha_cumprod, dtype=alphas_cumprod.dtype, device=timesteps.device)
    alpha_prod_t = alphas_cumprod[timesteps.long()]
    prev = prev_timesteps.long()
    alpha_prod_prev = torch.where(prev >= 0, alphas_cumprod[prev.clamp(min=0)], final)
    return alpha_prod_t, alpha_prod_prev


def _per_sample(value: Tensor | float, like: Tensor) -> Tensor:
    """A scalar or ``(B,)`` value shaped ``(B, 1, 1, ...)`` to broadcast over ``like: (B, ...)``."""
    value = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if value.dim() == 0:
        return value
    return value.reshape(-1, *([1] * (like.dim() - 1)))


def ddim_step_with_logprob(
    model_output: Tensor,
    sample: Tensor,
    alpha_prod_t: Tensor | float,
    alpha_prod_prev: Tensor | float,
    eta: float = 1.0,
    prev_sample: Tensor | None = None,
    noise: Tensor | None = None,
    generator: torch.Generator | None = None,
    prediction_type: PredictionType = "epsilon",
    clip_sample_range: float | None = None,
) -> tuple[Tensor, Tensor]:
    """One DDIM step ``x_t -> x_{t-1}`` and ``log p(x_{t-1} | x_t)`` averaged over the latent dimensions.

    ``model_output, sample: (B, C, H, W)``; ``alpha_prod_t, alpha_prod_prev``: scalars or ``(B,)`` (per-sample
    timesteps, from `ddim_alphas`). With ``prev_sample`` given (training: the stored action) it is scored, not
    sampled; otherwise ``x_{t-1} = mu + sigma * noise`` with ``noise`` (or a draw from ``generator``), the same
    sample diffusers' ``DDIMScheduler.step(..., eta=eta, variance_noise=noise)`` returns.
    Returns ``(prev_sample: (B, C, H, W), log_prob: (B,))``. Needs ``eta > 0``: at eta = 0 the step is
    deterministic and has no density.
    """
    if eta <= 0:
        raise ValueError(f"eta={eta}: a log-prob needs a stochastic step; use eta > 0 (DDPO uses 1.0)")
    a_t, a_prev = _per_sample(alpha_prod_t, sample), _per_sample(alpha_prod_prev, sample)
    b_t = 1 - a_t
    if prediction_type == "epsilon":
        x0, eps = (sample - b_t**0.5 * model_output) / a_t**0.5, model_output
    elif prediction_type == "sample":
        x0 = model_output
        eps = (sample - a_t**0.5 * x0) / b_t**0.5
    elif prediction_type == "v_prediction":
        x0 = a_t**0.5 * sample - b_t**0.5 * model_output
        eps = a_t**0.5 * model_output + b_t**0.5 * sample
    else:
        raise ValueError(f"prediction_type={prediction_type!r}: expected 'epsilon', 'sample' or 'v_prediction'")
    if clip_sample_range is not None:
        x0 = x0.clamp(-clip_sample_range, clip_sample_range)
    variance = (1 - a_prev) / b_t * (1 - a_t / a_prev)
    std = eta * variance**0.5
    mean = a_prev**0.5 * x0 + (1 - a_prev - std**2) ** 0.5 * eps
    if prev_sample is None:
        if noise is None:
            noise = torch.randn(model_output.shape, generator=generator, dtype=model_output.dtype).to(sample.device)
        prev_sample = mean + std * noise
    log_prob = gaussian_log_prob(prev_sample.detach(), mean, std)
    return prev_sample, log_prob


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor | float) -> Tensor:
    """``log N(x; mean, std^2)`` averaged over every dimension but the first: ``(B, ...) -> (B,)``."""
    std = torch.as_tensor(std, dtype=mean.dtype, device=mean.device)
    density = -((x - mean) ** 2) / (2 * std**2) - torch.log(std) - _LOG_SQRT_2PI
    return density.mean(dim=tuple(range(1, density.dim())))


def clipped_surrogate_loss(advantages: Tensor, clip_range: float, ratio: Tensor) -> Tensor:
    """``mean(max(-A * r, -A * clip(r, 1 - eps, 1 + eps)))`` over ``advantages`` and ``ratio`` (same shape)."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_range, 1 + clip_range)
    return torch.maximum(unclipped, clipped).mean()


def ddpo_clipped_loss(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, clip_range: float, adv_clip_max: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip loss (arXiv:1707.06347) for one denoising step of a batch, as DDPO trains it.

    ``log_prob`` (current policy, with grad), ``old_log_prob`` (at sampling), ``advantages``: all ``(B,)``.
    Advantages are clipped to ``[-adv_clip_max, adv_clip_max]``. Returns ``(loss, stats)``: the scalar loss
    ``mean(max(-A * r, -A * clip(r, 1 - eps, 1 + eps)))`` and detached ``approx_kl`` (``0.5 * mean((log r)^2)``),
    ``clipfrac`` (fraction with ``|r - 1| > eps``) and ``ratio`` (mean).
    """
    adv = advantages.clamp(-adv_clip_max, adv_clip_max)
    log_ratio = log_prob - old_log_prob.detach()
    ratio = torch.exp(log_ratio)
    loss = clipped_surrogate_loss(adv, clip_range, ratio)
    with torch.no_grad():
        stats = {
            "approx_kl": 0.5 * (log_ratio**2).mean(),
            "clipfrac": ((ratio - 1).abs() > clip_range).float().mean(),
            "ratio": ratio.mean(),
        }
    return loss, stats


class PerPromptStatTracker:
    """Reward normalisation per prompt (DDPO section 5): each prompt keeps its last ``buffer_size`` rewards;
    ``advantage = (r - mean) / (std + 1e-6)`` over that history, or over the current batch while the history
    holds fewer than ``min_count`` rewards. Pure Python state; ``state_dict`` goes into checkpoints."""

    def __init__(self, buffer_size: int, min_count: int):
        if buffer_size < 1 or min_count < 1:
            raise ValueError(f"buffer_size={buffer_size}, min_count={min_count}: both must be >= 1")
        self.buffer_size = buffer_size
        self.min_count = min_count
        self.stats: dict[str, deque[float]] = {}

    def update(self, prompts: list[str], rewards: Tensor) -> Tensor:
        """Record ``rewards: (B,)`` under their ``prompts`` (B strings); return advantages ``(B,)`` (float32)."""
        if len(prompts) != len(rewards):
            raise ValueError(f"{len(prompts)} prompts for {len(rewards)} rewards: expected one reward per prompt")
        rewards64 = rewards.detach().to("cpu", torch.float64).reshape(-1)
        advantages = torch.empty_like(rewards64)
        for prompt in dict.fromkeys(prompts):
            idx = torch.tensor([i for i, p in enumerate(prompts) if p == prompt])
            history = self.stats.setdefault(prompt, deque(maxlen=self.buffer_size))
            history.extend(rewards64[idx].tolist())
            ref = torch.tensor(list(history), dtype=torch.float64) if len(history) >= self.min_count else rewards64
            mean, std = ref.mean(), ref.std(unbiased=False)
            advantages[idx] = (rewards64[idx] - mean) / (std + 1e-6)
        return advantages.to(torch.float32)

    def get_stats(self) -> dict[str, float]:
        counts = [len(h) for h in self.stats.values()]
        return {"num_prompts": len(counts), "mean_history": sum(counts) / len(counts) if counts else 0.0}

    def clear(self) -> None:
        self.stats = {}

    def state_dict(self) -> dict:
        return {
            "buffer_size": self.buffer_size,
            "min_count": self.min_count,
            "stats": {prompt: list(history) for prompt, history in self.stats.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.buffer_size, self.min_count = int(state["buffer_size"]), int(state["min_count"])
        self.stats = {p: deque(map(float, h), maxlen=self.buffer_size) for p, h in state["stats"].items()}


def batch_advantages(rewards: Tensor) -> Tensor:
    """``(r - mean) / (std + 1e-8)`` over the whole batch ``(B,)`` (population std), DDPO without per-prompt
    tracking."""
    rewards = rewards.detach().to(torch.float64)
    return ((rewards - rewards.mean()) / (rewards.std(unbiased=False) + 1e-8)).to(torch.float32)
