"""The GRPO training objective of one micro-batch, assembled from `replayrl.algos` by the config's options.

loss = sum_t w_t * [ policy_loss_t(loss_type, importance_sampling_level)     (algos.policy_losses registry)
                     * is_weight_t * off_policy_keep_i * high_entropy_t       (optional masks / corrections)
                     + beta * KL_t (* ratio_t if use_bias_correction_kl) ]
       - entropy_coef * sum_t u_t * H_t                                       (entropy bonus, optional)
       + router_aux_loss_coef * aux / gradient_accumulation_steps             (MoE models, in the trainer)

with ``w`` the per-token weights of the loss_type (`algos.token_weights`, fixed once per generation batch) and
``u`` token-mean weights over the same batch (so the bonus is the mean token entropy, whatever the loss_type).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from replayrl import algos
from replayrl.grpo.rollout import Rollout


def loss_params(args) -> algos.PolicyLossParams:
    return algos.PolicyLossParams(
        epsilon_low=args.epsilon,
        epsilon_high=args.epsilon_high,
        delta=args.delta,
        sapo_temperature_pos=args.sapo_temperature_pos,
        sapo_temperature_neg=args.sapo_temperature_neg,
        vespo_k_pos=args.vespo_k_pos,
        vespo_lambda_pos=args.vespo_lambda_pos,
        vespo_k_neg=args.vespo_k_neg,
        vespo_lambda_neg=args.vespo_lambda_neg,
    )


@dataclass
class Objective:
    """The loss and what the metrics need. ``token_mask (B, T)`` bool: tokens that carry loss weight."""

    loss: Tensor
    terms: algos.PolicyLoss
    token_mask: Tensor
    kl: Tensor | None = None
    entropy_mask: Tensor | None = None
    off_policy_keep: Tensor | None = None


@dataclass
class Inputs:
    """Everything of one micro-batch the objective reads besides the config. Shapes (B, T) unless noted."""

    batch: Rollout
    logps: Tensor  # with gradient
    old: Tensor  # the ratio's denominator (behaviour, or proximal for replayed rows)
    behaviour: Tensor
    ref: Tensor | None = None
    is_weights: Tensor | None = None
    entropy: Tensor | None = None  # with gradient when the entropy bonus is on
    entropy_pool: Tensor | None = None  # flat, NaN-padded entropies of every process (top_entropy_quantile)
    entropy_weights: Tensor | None = None  # token-mean weights u (entropy bonus)
    entropy_coef: float = 0.0


def grpo_objective(args, x: Inputs) -> Objective:
    """The micro-batch loss (a scalar: this micro-batch's share of the optimizer-step loss)."""
    batch = x.batch
    mask = batch.loss_weights > 0
    out = algos.grpo_policy_loss(
        args.loss_type, x.logps, x.old, batch.advantages, mask, args.importance_sampling_level, loss_params(args)
    )
    per_token = out.per_token_loss
    if x.is_weights is not None:
        per_token = per_token * x.is_weights.detach()
    objective = Objective(loss=per_token.new_zeros(()), terms=out, token_mask=mask)
    if args.off_policy_mask_threshold is not None:
        objective.off_policy_keep = algos.off_policy_sequence_mask(
            batch.advantages, x.logps, x.behaviour, mask, args.off_policy_mask_threshold
        )
        per_token = per_token * objective.off_policy_keep
    if args.top_entropy_quantile < 1.0:
        objective.entropy_mask = algos.high_entropy_mask(x.entropy, mask, args.top_entropy_quantile, x.entropy_pool)
        per_token = per_token * objective.entropy_mask
    if args.beta != 0.0:
        kl = algos.kl_k3(x.logps, x.ref)
        if args.use_bias_correction_kl:
            kl = algos.importance_corrected_kl(kl, x.logps, x.old, mask, args.importance_sampling_level)
        objective.kl = kl
        per_token = per_token + args.beta * kl
    loss = (per_token * batch.loss_weights).sum()
    if x.entropy_coef != 0.0:
        effective = mask if objective.entropy_mask is None else objective.entropy_mask
        loss = loss - x.entropy_coef * (x.entropy * effective * x.entropy_weights).sum()
    objective.loss = loss
    return objective


@dataclass
class EntropyController:
    """The entropy bonus coefficient (TRL's `entropy_coef` / `use_adaptive_entropy`). Static: ``coef`` always.
    Adaptive: the mean token entropy of each optimizer step moves ``coef`` by ``delta`` (`algos.
    adaptive_entropy_coef`); the bonus applies only while the last measured entropy is at or below ``target``."""

    coef: float = 0.0
    adaptive: bool = False
    target: float = 0.2
    delta: float = 0.005
    coef_min: float = 0.0
    coef_max: float = 1.0
    last_entropy: float | None = None
    window: list[float] = field(default_factory=lambda: [0.0, 0.0])

    @classmethod
    def from_args(cls, args) -> EntropyController:
        return cls(
            args.entropy_coef,
            args.use_adaptive_entropy,
            args.entropy_target,
            args.entropy_coef_delta,
            args.entropy_coef_min,
            args.entropy_coef_max,
        )

    @property
    def enabled(self) -> bool:
        return self.adaptive or self.coef != 0.0

    def applied(self) -> float:
        return algos.applied_entropy_coef(self.coef, self.last_entropy, self.target, self.adaptive)

    def observe(self, total: float, count: float) -> None:
        self.window[0] += total
        self.window[1] += count

    def end_step(self, global_total: float, global_count: float) -> None:
        """At an optimizer-step boundary, with the window's sums over every process."""
        entropy = global_total / max(global_count, 1.0)
        self.coef = algos.adaptive_entropy_coef(
            self.coef, entropy, self.target, self.delta, self.coef_min, self.coef_max
        )
        self.last_entropy = entropy
        self.window = [0.0, 0.0]

    def state_dict(self) -> dict:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict) -> None:
        self.coef, self.last_entropy = state["coef"], state["last_entropy"]


def entropy_pool(accelerator, entropy: Tensor, mask: Tensor) -> Tensor:
    """Flat entropies of every process's real tokens, NaN elsewhere (for a global entropy quantile)."""
    local = torch.where(mask, entropy.detach().float(), torch.nan).reshape(-1)
    if accelerator.num_processes == 1:
        return local
    local = accelerator.pad_across_processes(local, dim=0, pad_index=float("nan"))
    return accelerator.gather(local)
