"""TRL v0.7.1's PPOTrainer's overridable math methods: `_kl_penalty`, `compute_rewards`,
`compute_advantages` and `loss`, with v0.7.1's signatures and return values. `PPOTrainer.step` goes through
them, so a subclass that overrides one changes the update. The formulas are `replayrl.algos.ppo`'s.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from replayrl.algos import entropy_from_logits
from replayrl.algos import ppo as F
from replayrl.ppo.batch import ForwardOutput
from replayrl.ppo.stats import minibatch_stats


class PPOSeedMethodsMixin:
    """Needs `config` (PPOConfig), `kl_ctl`, `accelerator` and `_reduce_sum` (a sum over processes)."""

    def _kl_penalty(self, logprob: Tensor, ref_logprob: Tensor) -> Tensor:
        """Per-token KL penalty by `config.kl_penalty`: logprob, ref_logprob (B, T) (for "full": (B, T, V)
        log-softmaxed distributions) -> (B, T). kl: logp - ref; abs: |logp - ref|; mse: (logp - ref)^2 / 2;
        full: KL(pi || ref) over the vocabulary."""
        kind = self.config.kl_penalty
        if kind == "full":
            return F.kl_penalty(logprob, ref_logprob, kind, logprob, ref_logprob)
        return F.kl_penalty(logprob, ref_logprob, kind)

    def compute_rewards(self, scores: Tensor, logprobs: Tensor, ref_logprobs: Tensor, masks: Tensor):
        """Per-token rewards: ``-kl_coef * KL_t`` at every response token, plus the score on the last one.

        scores (B,); logprobs, ref_logprobs (B, T) (or (B, T, V) with kl_penalty "full"); masks (B, T).
        Returns v0.7.1's ``(rewards (B, T), non_score_rewards (B, T))``, both 0 on masked tokens.
        """
        kl = self._kl_penalty(logprobs, ref_logprobs)
        return F.token_rewards(scores.to(kl.device), kl, self.kl_ctl.value, masks)

    def compute_advantages(self, values: Tensor, rewards: Tensor, mask: Tensor):
        """GAE over the response tokens (`config.gamma`, `config.lam`); values, rewards, mask (B, T).

        Returns v0.7.1's ``(values * mask, advantages (whitened over the batch of all processes), returns)``,
        all (B, T) and detached; returns = raw GAE + values, the value target.
        """
        advantages, returns = F.advantages_and_returns(
            values, rewards, mask, self.config.gamma, self.config.lam, reduce_sum=self._reduce_sum
        )
        return (values * mask.to(values.dtype)).detach(), advantages, returns

    def loss(
        self,
        old_logprobs: Tensor,
        values: Tensor,
        logits: Tensor,
        vpreds: Tensor,
        logprobs: Tensor,
        mask: Tensor,
        advantages: Tensor,
        returns: Tensor,
    ):
        """Clipped policy loss and clipped value loss of one mini-batch.

        old_logprobs, values, advantages, returns: the rollout's (B, T); logits (B, T, V) and vpreds, logprobs
        (B, T): the current forward pass (logits only feed the entropy stat). Returns v0.7.1's
        ``(pg_loss, vf_coef * vf_loss, stats)``; the token means are over the mini-batch of all processes. A
        mini-batch whose mean ratio exceeds `config.ratio_threshold` gets zero losses (a warning, as TRL v0.7.1).
        """
        config = self.config
        num_tokens = self._reduce_sum(mask.sum().float()) / self.accelerator.num_processes
        pg_loss, pg_clipfrac, ratio = F.policy_loss(
            logprobs, old_logprobs, advantages, mask, config.cliprange, num_tokens
        )
        vf_loss, vf_clipfrac = F.value_loss(
            vpreds, values, returns, mask, config.cliprange_value, config.vf_coef, num_tokens
        )
        loss = pg_loss + vf_loss
        avg_ratio = F.masked_mean(ratio, mask).item()
        if avg_ratio > config.ratio_threshold:
            warnings.warn(
                f"The average ratio of this mini-batch is {avg_ratio:.2f} > ratio_threshold={config.ratio_threshold}; "
                "skipping it (loss set to 0, as TRL v0.7.1).",
                stacklevel=2,
            )
            pg_loss, vf_loss, loss = pg_loss * 0.0, vf_loss * 0.0, loss * 0.0
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())
        current = ForwardOutput(logprobs, vpreds, entropy=entropy)
        rollout = {"logprobs": old_logprobs, "values": values, "advantages": advantages, "returns": returns}
        losses = {"policy": pg_loss, "value": vf_loss, "total": loss, "pg_clipfrac": pg_clipfrac}
        losses["vf_clipfrac"] = vf_clipfrac
        return pg_loss, vf_loss, minibatch_stats(current, rollout, mask, ratio, losses)
