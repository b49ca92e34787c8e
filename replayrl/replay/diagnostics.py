"""What replayed rows contribute to a GRPO loss: the figures behind the `replay/*` loss metrics.

Pure torch. Every function returns `{name: (sum, count)}` pairs that the trainer reduces across processes and
micro-batches (`GRPOTrainer._reduce_means`), so a logged value is sum over the step / count over the step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from replayrl.grpo.rollout import Rollout


def clipped_without_gradient(log_ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """Tokens whose PPO ratio is clipped so that they carry no policy gradient. log_ratio: (N, C) log pi/mu,
    advantages: (N,). -> (N, C) bool: (ratio > 1 + eps_high and A > 0) or (ratio < 1 - eps_low and A < 0)."""
    ratio = log_ratio.exp()
    adv = advantages.unsqueeze(1)
    return ((ratio > 1 + eps_high) & (adv > 0)) | ((ratio < 1 - eps_low) & (adv < 0))


def replay_loss_metrics(
    batch: Rollout, logps: Tensor, behaviour: Tensor, mask: Tensor, eps: tuple[float, float], decoupled: bool
) -> dict[str, tuple[Tensor, Tensor]]:
    """(sum, count) pairs for one micro-batch. logps, behaviour: (N, C) current and behaviour log-probs (detached);
    mask: (N, C) bool, tokens with loss weight.

    - importance_ratio_mean / importance_ratio_abs_log_mean: pi_theta / pi_behaviour on replayed tokens;
    - clipped_token_frac: replayed tokens with no gradient because their ratio is clipped (0 under the decoupled
      objective, whose ratio is taken against the current policy: not reported there);
    - loss_weight_share: replayed share of the loss's token weight;
    - adv_weight_share: replayed share of sum(weight * |A|), the weight that carries gradient;
    - informative_weight_frac: share of the token weight on rows with a non-zero advantage (replayed or fresh).
    """
    replayed_rows = batch.replayed.unsqueeze(1)
    replayed = mask & replayed_rows
    log_ratio = logps.float() - behaviour.float()
    count = replayed.sum()
    weights = batch.loss_weights.float() * mask
    adv_weight = weights * batch.advantages.abs().unsqueeze(1).float()
    out = {
        "replay/importance_ratio_mean": (log_ratio[replayed].exp().sum(), count),
        "replay/importance_ratio_abs_log_mean": (log_ratio[replayed].abs().sum(), count),
        "replay/loss_weight_share": ((weights * replayed_rows).sum(), weights.sum()),
        "replay/adv_weight_share": ((adv_weight * replayed_rows).sum(), adv_weight.sum()),
        "replay/informative_weight_frac": ((weights * (batch.advantages != 0).unsqueeze(1)).sum(), weights.sum()),
    }
    if not decoupled:
        clipped = clipped_without_gradient(log_ratio, batch.advantages, *eps)
        out["replay/clipped_token_frac"] = ((clipped & replayed).sum(), count)
    return {k: (s.detach(), torch.as_tensor(c)) for k, (s, c) in out.items()}
