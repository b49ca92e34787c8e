"""The GRPO training objective of one micro-batch, assembled from `replayrl.algos` by the config's options.

The whole objective, in the papers' names (DeepSeekMath arXiv:2402.03300, DAPO arXiv:2503.14476, Dr. GRPO
arXiv:2503.20783). A generation batch holds N completions o_i in groups of G per prompt q, sampled from pi_old
(the behaviour policy); t runs over o_i's loss tokens (completion minus tool results, minus truncated completions
with mask_truncated_completions); sg() stops the gradient.

  advantage  A_i = (R_i - mean_g R) / (std_g R + 1e-4)   R_i the weighted sum of the rewards; scale_rewards "group";
             "batch": the batch's std; "none" (Dr. GRPO): no division; "mean": / mean_g R; GDPO: normalize_then_sum
  ratio      r_it = pi_theta(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)                 importance_sampling_level
             "token"; "sequence" (GSPO): r_it = exp(mean_t log r_it) for every t of o_i
  clip       l_it = -min(r_it A_i, clip(r_it, 1 - eps_low, 1 + eps_high) A_i)           eps_low = epsilon,
             eps_high = epsilon_high (DAPO clip-higher); delta: min(r_it, delta) in the first term (INTELLECT-2);
             cispo / sapo / vespo replace l_it (algos.policy_losses)
  KL         D_it = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1 (k3 >= 0), times r_it if use_bias_correction_kl
  token      L_it = l_it * c_it * m_i * h_it + beta * D_it
  objective  loss = sum_it w_it L_it - entropy_coef * sum_it u_it H_it + router_aux_loss_coef * aux / grad_acc

w_it (`algos.token_weights`, one entry of `algos.GRPO_LOSSES` per loss_type), over the process's whole generation
batch, times steps_per_generation / gradient_accumulation_steps; |o_i| its loss tokens, T = max_completion_length,
P processes:
  grpo, sapo  1 / (N |o_i|)     (mean per sequence, then over sequences: the paper's 1/G sum_i 1/|o_i| sum_t)
  bnpo        1 / sum_i |o_i|   (token mean over this process's batch)
  dr_grpo     1 / (N T)         (Dr. GRPO: a constant, no length bias)
  dapo, cispo, vespo  1 / (sum over every process of sum_i |o_i| / P)   (DAPO's token-level mean)
  luspo       1 / N             (each sequence's loss times its length)
u_it = the dapo weight, on the h_it tokens (the bonus is the mean token entropy H, whatever the loss_type).

Corrections (1 when off): c_it = engine weight (vLLM: truncated or masked pi_trainer / pi_engine,
vllm_importance_sampling_*) times the replay weight below; m_i = 0 for off_policy_mask_threshold sequences (A_i < 0
and mean_t log(pi_old / pi_theta) above it, DeepSeek-V3.2); h_it = 1 on the top_entropy_quantile tokens only.

Replayed (off-policy) rows keep the A_i, pi_old and pi_ref of when they were generated. With replay_importance_cap
C (decoupled PPO, arXiv:2110.00641) their ratio is taken against pi_prox = sg(pi_theta) (value 1, never clipped) and
c_it = sg(min(pi_theta / pi_old, C)) (per sequence with "sequence"); with C = None, r_it = pi_theta / pi_old as
above (TRL's GRPOWithReplayBuffer). Fresh rows: pi_old is the behaviour policy; before the policy moves it is
sg(pi_theta), so r_it = 1 in value and l_it = -A_i r_it has the policy gradient.
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
    policy_loss: Tensor | None = None  # the loss before the entropy bonus (TRL's `policy_loss` metric)


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
    entropy_mask: Tensor | None = None  # (B, T) bool, top_entropy_quantile tokens (GRPOTrainer.get_high_entropy_mask)
    off_policy_keep: Tensor | None = None  # (B, 1), off_policy_mask_threshold (GRPOTrainer.get_off_policy_mask)
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
        objective.off_policy_keep = x.off_policy_keep
        if x.off_policy_keep is None:
            objective.off_policy_keep = algos.off_policy_sequence_mask(
                batch.advantages, x.logps, x.behaviour, mask, args.off_policy_mask_threshold
            )
        per_token = per_token * objective.off_policy_keep
    if args.top_entropy_quantile < 1.0:
        objective.entropy_mask = x.entropy_mask
        if x.entropy_mask is None:
            objective.entropy_mask = algos.high_entropy_mask(x.entropy, mask, args.top_entropy_quantile)
        per_token = per_token * objective.entropy_mask
    if args.beta != 0.0:
        kl = algos.kl_k3(x.logps, x.ref)
        if args.use_bias_correction_kl:
            kl = algos.importance_corrected_kl(kl, x.logps, x.old, mask, args.importance_sampling_level)
        objective.kl = kl
        per_token = per_token + args.beta * kl
    loss = (per_token * batch.loss_weights).sum()
    objective.policy_loss = loss.detach()
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
