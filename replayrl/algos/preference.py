"""Preference losses as pure functions: the Bradley-Terry reward-model loss and DPO with its variants.

Every DPO-family loss takes a `PairLogps` (sequence log-probs of the chosen and rejected completions under the
policy and the reference, shapes (B,)) and `beta`, and returns per-pair losses (B,). `DPO_LOSSES` maps TRL's
`loss_type` names to them; `dpo_losses` combines several with weights. Notation: for a completion y,
`logratio(y) = log pi(y|x) - log pi_ref(y|x)`, and `Delta = logratio(chosen) - logratio(rejected)` (the DPO
"logits"). With policy == reference, Delta = 0 and the sigmoid loss is ln 2 with dL/dDelta = -beta / 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

FDivergence = Literal["reverse_kl", "forward_kl", "js_divergence", "alpha_divergence"]
F_DIVERGENCES = ("reverse_kl", "forward_kl", "js_divergence", "alpha_divergence")


# --------------------------------------------------------------------------------------------- reward model
def bradley_terry_loss(
    chosen_rewards: Tensor,
    rejected_rewards: Tensor,
    margin: Tensor | None = None,
    center_rewards_coefficient: float | None = None,
) -> Tensor:
    """Mean of `-log sigmoid(r_c - r_r - margin)` (Bradley-Terry; margin as Llama 2, arXiv:2307.09288), plus
    `c * mean((r_c + r_r)^2)` when `center_rewards_coefficient` c is set (arXiv:2312.09244): it pulls the
    rewards towards zero mean without changing their differences. Rewards and margin: (B,). Returns a scalar."""
    diff = chosen_rewards - rejected_rewards
    if margin is not None:
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * ((chosen_rewards + rejected_rewards) ** 2).mean()
    return loss


def pairwise_accuracy(chosen_rewards: Tensor, rejected_rewards: Tensor) -> Tensor:
    """Fraction of pairs with `r_c > r_r`, (B,) -> scalar. Ties count as wrong (a model that scores everything
    the same has accuracy 0, not 0.5 or 1)."""
    return (chosen_rewards > rejected_rewards).float().mean()


# --------------------------------------------------------------------------------------------- DPO inputs
@dataclass
class PairLogps:
    """Sequence log-probs, each (B,): sums over completion tokens. Lengths (B,) are completion token counts,
    needed by the length-normalised losses (ipo, sigmoid_norm, sft). `chosen_plain` (B,): the chosen completion's
    unweighted log-prob sum where `chosen` is LD-DPO-weighted (`ld_token_weights`); the sft loss reads it (None:
    `chosen` itself)."""

    chosen: Tensor
    rejected: Tensor
    ref_chosen: Tensor
    ref_rejected: Tensor
    chosen_lengths: Tensor | None = None
    rejected_lengths: Tensor | None = None
    chosen_plain: Tensor | None = None

    @property
    def chosen_logratios(self) -> Tensor:
        return self.chosen - self.ref_chosen

    @property
    def rejected_logratios(self) -> Tensor:
        return self.rejected - self.ref_rejected

    def lengths(self) -> tuple[Tensor, Tensor]:
        if self.chosen_lengths is None or self.rejected_lengths is None:
            raise ValueError("this loss type divides by completion length: give chosen_lengths and rejected_lengths")
        return self.chosen_lengths.to(self.chosen.dtype), self.rejected_lengths.to(self.rejected.dtype)

    def normalised(self) -> PairLogps:
        """Per-token means instead of sums (IPO's length normalisation, arXiv:2310.12036)."""
        lc, lr = self.lengths()
        lc, lr = lc.clamp(min=1), lr.clamp(min=1)
        return PairLogps(self.chosen / lc, self.rejected / lr, self.ref_chosen / lc, self.ref_rejected / lr, lc, lr)


def _cap_exp(x: Tensor) -> Tensor:
    """exp(x) without overflow to inf."""
    return torch.exp(x.clamp(max=math.log(torch.finfo(x.dtype).max) - 1))


def dpo_logits(pairs: PairLogps, f_divergence_type: str = "reverse_kl", f_alpha_divergence_coef: float = 0.5) -> Tensor:
    """Delta (B,) = f'(u_c) - f'(u_r), u = pi/pi_ref: the margin every DPO-family loss is a function of, under an
    f-divergence (f-DPO, arXiv:2309.16240), as TRL 1.16. reverse_kl: f'(u) = log u, logratio(c) - logratio(r).
    forward_kl: f'(u) = 1 - 1/u. js_divergence: f'(u) = log(2u / (u + 1)). alpha_divergence (alpha =
    `f_alpha_divergence_coef`): f'(u) = (u^(alpha-1) - 1) / (alpha - 1); alpha = 1 is reverse_kl (the limit),
    alpha = 0 forward_kl."""
    cr, rr = pairs.chosen_logratios, pairs.rejected_logratios
    if f_divergence_type == "js_divergence":
        return cr - rr - (F.softplus(cr) - F.softplus(rr))  # logsigmoid(cr) - logsigmoid(rr)
    if f_divergence_type == "forward_kl":
        f_alpha_divergence_coef, f_divergence_type = 0.0, "alpha_divergence"
    if f_divergence_type == "alpha_divergence":
        a = 1.0 - f_alpha_divergence_coef  # f'(u_c) - f'(u_r) = (u_r^-a - u_c^-a) / a
        if abs(a) < 1e-6:
            return cr - rr
        return (_cap_exp(-a * rr) - _cap_exp(-a * cr)) / a
    if f_divergence_type == "reverse_kl":
        return cr - rr
    raise ValueError(f"f_divergence_type must be one of {F_DIVERGENCES} (got {f_divergence_type!r})")


def shared_completion_lengths(lengths: Tensor) -> Tensor:
    """lengths (2B,), the B chosen completions' first, then the B rejected ones -> (2B,): each sequence's pair's
    min(|y_c|, |y_r|), LD-DPO's shared length."""
    half = lengths.shape[0] // 2
    shared = torch.minimum(lengths[:half], lengths[half:])
    return torch.cat([shared, shared])


def ld_token_weights(positions: Tensor, shared_lengths: Tensor, ld_alpha: float) -> Tensor:
    """LD-DPO's token weights (length desensitization, arXiv:2409.06411; TRL's `ld_alpha`): 1 for a completion's
    first `shared_lengths` tokens (the length both completions of the pair reach), `ld_alpha` for the verbose tail
    beyond, 0 off the completion. A sequence log-prob is then sum_t w_t log p_t.
    positions: (..., T) 1-based index of each token within its completion, 0 elsewhere; shared_lengths: broadcast
    against positions (e.g. (R, 1) per row, or (1, T) per token)."""
    weights = torch.where(positions <= shared_lengths, 1.0, ld_alpha)
    return weights * (positions > 0)


# --------------------------------------------------------------------------------------------- DPO variants
# Each: (pairs, beta, opts) -> (B,). `opts` holds label_smoothing, f_divergence_type, f_alpha_divergence_coef,
# discopop_tau, bco_delta.
def _smoothed_sigmoid(z: Tensor, eps: float) -> Tensor:
    return -F.logsigmoid(z) * (1 - eps) - F.logsigmoid(-z) * eps


def sigmoid_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """DPO (arXiv:2305.18290): -log sigmoid(beta Delta); with label smoothing eps, conservative DPO (cDPO)."""
    return _smoothed_sigmoid(beta * _delta(pairs, opts), opts.get("label_smoothing", 0.0))


def sigmoid_norm_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """Sigmoid on length-normalised log-probs (per-token means)."""
    return sigmoid_loss(pairs.normalised(), beta, opts)


def robust_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """Robust DPO (arXiv:2403.00409), unbiased under label-flip rate eps:
    ((1 - eps) (-log s(b D)) - eps (-log s(-b D))) / (1 - 2 eps)."""
    eps = opts.get("label_smoothing", 0.0)
    z = beta * _delta(pairs, opts)
    return (-F.logsigmoid(z) * (1 - eps) + F.logsigmoid(-z) * eps) / (1 - 2 * eps)


def hinge_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """SLiC (arXiv:2305.10425): relu(1 - beta Delta)."""
    return torch.relu(1 - beta * _delta(pairs, opts))


def ipo_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """IPO (arXiv:2310.12036): (Delta - 1 / (2 beta))^2 on per-token mean log-probs."""
    return (_delta(pairs.normalised(), opts) - 1 / (2 * beta)) ** 2


def exo_pair_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """EXO (arXiv:2402.00856), pairwise: KL(p_theta || p_label) with p_theta = sigmoid(beta Delta) and the label
    distribution (1 - eps, eps); eps defaults to 1e-3 when label_smoothing is 0."""
    eps = opts.get("label_smoothing", 0.0) or 1e-3
    z = beta * _delta(pairs, opts)
    return torch.sigmoid(z) * (F.logsigmoid(z) - math.log(1 - eps)) + torch.sigmoid(-z) * (
        F.logsigmoid(-z) - math.log(eps)
    )


def nca_pair_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """NCA (arXiv:2402.05369), pairwise: -log s(r_c) - 0.5 log s(-r_c) - 0.5 log s(-r_r), r = beta logratio."""
    rc, rr = beta * pairs.chosen_logratios, beta * pairs.rejected_logratios
    return -F.logsigmoid(rc) - 0.5 * F.logsigmoid(-rc) - 0.5 * F.logsigmoid(-rr)


def bco_pair_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """BCO (arXiv:2404.04656), pairwise: -log s(r_c - delta) - log s(-(r_r - delta)), r = beta logratio.
    delta: `opts["bco_delta"]` if given (TRL keeps a running mean), else the batch mean of all rewards
    (detached)."""
    rc, rr = beta * pairs.chosen_logratios, beta * pairs.rejected_logratios
    delta = opts.get("bco_delta")
    if delta is None:
        delta = torch.cat([rc, rr]).detach().mean()
    return -F.logsigmoid(rc - delta) - F.logsigmoid(-(rr - delta))


def sppo_hard_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """SPPO with hard labels (arXiv:2405.00675): (logratio(c) - 1/(2 beta))^2 + (logratio(r) + 1/(2 beta))^2."""
    half = 0.5 / beta
    return (pairs.chosen_logratios - half) ** 2 + (pairs.rejected_logratios + half) ** 2


def aot_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """AOT (arXiv:2406.05882), unpaired: sort the policy log-ratios log pi(c) - log pi(r) and the reference
    ones across the batch, Delta_i = sorted_policy_i - sorted_ref_i, then the smoothed sigmoid loss."""
    policy, _ = torch.sort(pairs.chosen - pairs.rejected)
    ref, _ = torch.sort(pairs.ref_chosen - pairs.ref_rejected)
    return _smoothed_sigmoid(beta * (policy - ref), opts.get("label_smoothing", 0.0))


def aot_pair_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """AOT, paired: sort logratio(c) and logratio(r) separately, Delta_i = sorted_c_i - sorted_r_i."""
    c, _ = torch.sort(pairs.chosen_logratios)
    r, _ = torch.sort(pairs.rejected_logratios)
    return _smoothed_sigmoid(beta * (c - r), opts.get("label_smoothing", 0.0))


def apo_zero_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """APO-zero (arXiv:2408.06266): 1 - s(beta logratio(c)) + s(beta logratio(r)); raises chosen likelihood,
    for chosen answers better than the model's own."""
    return 1 - torch.sigmoid(beta * pairs.chosen_logratios) + torch.sigmoid(beta * pairs.rejected_logratios)


def apo_down_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """APO-down (arXiv:2408.06266): s(beta logratio(c)) + 1 - s(beta (logratio(c) - logratio(r))); lowers both
    likelihoods, for chosen answers worse than the model's own."""
    cr, rr = pairs.chosen_logratios, pairs.rejected_logratios
    return torch.sigmoid(beta * cr) + 1 - torch.sigmoid(beta * (cr - rr))


def discopop_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """DiscoPOP (arXiv:2406.08414), log-ratio modulated: with z = beta Delta and m = s(z / tau),
    (1 - m) (-log s(z)) + m exp(-z). tau: `opts["discopop_tau"]` (0.05)."""
    z = beta * _delta(pairs, opts)
    m = torch.sigmoid(z / opts.get("discopop_tau", 0.05))
    return -F.logsigmoid(z) * (1 - m) + torch.exp(-z) * m


def sft_loss(pairs: PairLogps, beta: float, opts: dict) -> Tensor:
    """Supervised loss on the chosen completion: its mean token NLL, -log pi(c) / |c| (beta unused)."""
    lc, _ = pairs.lengths()
    chosen = pairs.chosen if pairs.chosen_plain is None else pairs.chosen_plain
    return -chosen / lc.clamp(min=1)


def _delta(pairs: PairLogps, opts: dict) -> Tensor:
    return dpo_logits(pairs, opts.get("f_divergence_type", "reverse_kl"), opts.get("f_alpha_divergence_coef", 0.5))


DPO_LOSSES: dict[str, Callable[[PairLogps, float, dict], Tensor]] = {
    "sigmoid": sigmoid_loss,
    "sigmoid_norm": sigmoid_norm_loss,
    "hinge": hinge_loss,
    "ipo": ipo_loss,
    "robust": robust_loss,
    "exo_pair": exo_pair_loss,
    "nca_pair": nca_pair_loss,
    "bco_pair": bco_pair_loss,
    "sppo_hard": sppo_hard_loss,
    "aot": aot_loss,
    "aot_pair": aot_pair_loss,
    "aot_unpaired": aot_pair_loss,  # TRL 1.16's name for aot_pair (TRL: "AOT loss for unpaired datasets")
    "apo_zero": apo_zero_loss,
    "apo_down": apo_down_loss,
    "discopop": discopop_loss,
    "sft": sft_loss,
}


# The losses that are functions of the margin Delta alone (`_delta`), so an f-divergence other than reverse KL
# applies to them: the f-DPO reparameterisation leaves a beta log Z(x) term that cancels only in the chosen-rejected
# difference (TRL 1.16 refuses the others too).
F_DIVERGENCE_LOSSES = ("sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop", "sft")


def check_f_divergence(f_divergence_type: str, loss_types: Sequence[str]) -> None:
    """ValueError unless ``f_divergence_type`` is known and, when it is not reverse_kl, every loss takes it."""
    if f_divergence_type not in F_DIVERGENCES:
        raise ValueError(f"f_divergence_type must be one of {F_DIVERGENCES} (got {f_divergence_type!r}).")
    others = [t for t in loss_types if t not in F_DIVERGENCE_LOSSES]
    if f_divergence_type != "reverse_kl" and others:
        raise ValueError(
            f"f_divergence_type={f_divergence_type!r} applies only to the losses of the margin alone "
            f"{F_DIVERGENCE_LOSSES}; loss_type has {others}: use f_divergence_type='reverse_kl' or drop them."
        )


def check_loss_types(loss_types: Sequence[str], loss_weights: Sequence[float] | None = None) -> None:
    """ValueError for an unknown loss type (never a silent fallback to sigmoid) or mismatched weights."""
    unknown = [t for t in loss_types if t not in DPO_LOSSES]
    if unknown:
        raise ValueError(f"unknown loss_type {unknown}: valid loss types are {sorted(DPO_LOSSES)}")
    if not loss_types:
        raise ValueError(f"loss_type is empty: give one or more of {sorted(DPO_LOSSES)}")
    if loss_weights is not None and len(loss_weights) != len(loss_types):
        raise ValueError(
            f"loss_weights has {len(loss_weights)} entries but loss_type has {len(loss_types)} ({list(loss_types)})"
            ": give one weight per loss type, or none (all 1.0)."
        )


def dpo_losses(
    loss_types: Sequence[str] | str,
    pairs: PairLogps,
    beta: float,
    loss_weights: Sequence[float] | None = None,
    **opts,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Weighted sum of the per-pair losses of `loss_types`: sum_k w_k * loss_k (B,), and each part (B,) by name.
    `opts`: label_smoothing, f_divergence_type, f_alpha_divergence_coef, discopop_tau, bco_delta."""
    loss_types = [loss_types] if isinstance(loss_types, str) else list(loss_types)
    check_loss_types(loss_types, loss_weights)
    weights = list(loss_weights) if loss_weights is not None else [1.0] * len(loss_types)
    parts = {t: DPO_LOSSES[t](pairs, beta, opts) for t in loss_types}
    total = sum(w * parts[t] for t, w in zip(loss_types, weights))
    return total, parts


def implicit_rewards(pairs: PairLogps, beta: float) -> tuple[Tensor, Tensor]:
    """DPO's implicit rewards beta * logratio for chosen and rejected, (B,) each, detached."""
    return (beta * pairs.chosen_logratios).detach(), (beta * pairs.rejected_logratios).detach()


# --------------------------------------------------------------------------------------------- WPO weights
@torch.no_grad()
def wpo_token_terms(logits: Tensor, labels: Tensor) -> Tensor:
    """WPO (arXiv:2406.11827, Eq. 3) per token: log p(y_t) - log sum_v p(v)^2. logits (N, T, V), labels (N, T)
    -> (N, T). Row by row to bound memory."""
    out = []
    for row_logits, row_labels in zip(logits, labels):
        logp = torch.log_softmax(row_logits.float(), dim=-1)
        out.append(logp.gather(-1, row_labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(2 * logp, dim=-1))
    return torch.stack(out)


def wpo_log_weights(logits: Tensor, labels: Tensor, mask: Tensor) -> Tensor:
    """Per-sequence WPO log-weight: the mean of `wpo_token_terms` over completion tokens, (N, T, V) -> (N,)."""
    return (wpo_token_terms(logits, labels) * mask).sum(1) / mask.sum(1).clamp(min=1)


def wpo_weights(chosen_log_weights: Tensor, rejected_log_weights: Tensor) -> Tensor:
    """Pair weight min(1, exp(w_c + w_r)), (B,)."""
    return torch.clamp(torch.exp(chosen_log_weights + rejected_log_weights), max=1)
