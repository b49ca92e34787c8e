"""`RLOOTrainer`: REINFORCE Leave-One-Out (arXiv:2402.14740) as TRL 1.16's `RLOOTrainer`, on replayrl's GRPO.

What runs, per generation batch: GRPO's rollout unchanged (sampler, generation backends with vLLM, reward
functions, dynamic sampling, tools, the replay buffer when `replay_buffer_size > 0`), then two hooks:
  1. advantages (`_add_logps`): reward r (summed over functions, clipped to `reward_clip_range`), minus
     ``beta * sum_t (log pi_old - log pi_ref)`` (the k1 KL of the whole completion, as TRL's RLOO: in the reward,
     not in the loss); then the leave-one-out advantage ``A_i = r_i - mean_{j != i} r_j`` within each prompt's
     group (`algos.rloo.rloo_advantages`), optionally normalised over the global batch;
  2. loss (`_objective`): one importance ratio per completion, ``rho = exp(sum_t log pi - log pi_old)``, PPO-clipped
     with `epsilon` / `epsilon_high`, averaged over the completions of the global batch
     (`algos.rloo.sequence_clipped_surrogate`). With num_iterations=1 and on-policy batches rho = 1 and this is
     plain REINFORCE with the leave-one-out baseline.

Departures from TRL: docs/deviations.md (RLOO section).
"""

from __future__ import annotations

import torch
from torch import Tensor

from replayrl import algos
from replayrl.algos import rloo
from replayrl.grpo.objective import Inputs, Objective
from replayrl.grpo.rollout import Rollout
from replayrl.replay.trainer import GRPOWithReplayBufferTrainer
from replayrl.rloo.config import RLOOConfig


class RLOOTrainer(GRPOWithReplayBufferTrainer):
    """TRL-compatible RLOO trainer: `RLOOTrainer(model, reward_funcs, args=RLOOConfig(...), train_dataset, ...)`,
    the same arguments as [`GRPOTrainer`] (and TRL's `RLOOTrainer`)."""

    _tag_names = ["trl", "rloo", "replayrl"]
    _name = "RLOO"  # the method on the model card (replayrl.model_card.METHODS)
    _ref_adapter_needs_beta = False  # TRL 1.16's RLOO adds the "ref" adapter whatever beta

    @staticmethod
    def _default_config(output_dir: str) -> RLOOConfig:
        return RLOOConfig(output_dir=output_dir.replace("-GRPO", "-RLOO"))

    # ----------------------------------------------------------------------------------------- advantages
    @torch.no_grad()
    def _add_logps(self, rollout: Rollout, mode: str) -> Rollout:
        """GRPO's log-probs, then RLOO's advantages (replacing GRPO's): they need the KL of each completion."""
        rollout = super()._add_logps(rollout, mode)
        rewards = rollout.rewards
        if self.args.reward_clip_range is not None:
            low, high = self.args.reward_clip_range
            rewards = rewards.clamp(min=low, max=high)
        if self.args.beta != 0.0:
            rewards = rewards - self.args.beta * self._sequence_kl(rollout, mode)
        G = self._group_size(mode)
        if self.args.normalize_advantages:  # over the global batch; groups never straddle processes
            all_advantages = rloo.rloo_advantages(self.accelerator.gather(rewards), G, normalize=True)
            n, rank = rewards.numel(), self.accelerator.process_index
            advantages = all_advantages[rank * n : (rank + 1) * n]
        else:
            advantages = rloo.rloo_advantages(rewards, G)
        if self._last_completions.get("advantage") is not None:  # the completions table shows RLOO's
            self._last_completions["advantage"] = advantages.tolist()
        return rollout.with_(advantages=advantages)

    def _sequence_kl(self, rollout: Rollout, mode: str) -> Tensor:
        """``sum_t (log pi_old - log pi_ref)`` over each completion's tokens, ``(N,)`` (TRL's RLOO: the k1
        estimate, which can be negative). Logs its global per-token mean as `kl`."""
        old = rollout.old_logps
        if old is None:  # on-policy: the loss pass would supply them, but the reward needs them now
            old = self._token_logps(self.model, rollout)[0]
        mask = rollout.completion_mask.float()
        per_token = torch.where(mask.bool(), old - rollout.ref_logps, 0.0)
        self._reduce_means(mode, {"kl": (per_token.sum(), mask.sum())})
        return per_token.sum(-1)

    # ----------------------------------------------------------------------------------------- loss
    def _objective(self, x: Inputs) -> Objective:
        return rloo_objective(self.args, x)


def rloo_objective(args: RLOOConfig, x: Inputs) -> Objective:
    """RLOO's micro-batch loss: per-sequence clipped surrogate, each sequence weighted by its share of the global
    batch. The 'grpo' token weights of a row sum to 1 / N over its tokens, so spreading the sequence loss over its
    tokens and summing ``loss * weight`` is the mean over sequences, however the batch is split."""
    batch = x.batch
    mask = batch.loss_weights > 0
    log_ratio = torch.where(mask, x.logps - x.old.detach(), 0.0).sum(-1)
    loss, ratio, low, high = rloo.sequence_clipped_surrogate(
        log_ratio, batch.advantages, args.epsilon, args.epsilon_high
    )
    per_token = loss.unsqueeze(1).expand_as(x.logps)
    if x.is_weights is not None:  # engine mismatch or replayed rows: token weights, averaged over the sequence
        per_token = per_token * x.is_weights.detach()
    terms = algos.PolicyLoss(
        per_token_loss=per_token,
        ratio=ratio.unsqueeze(1),
        low_clipped=low.unsqueeze(1).expand_as(mask),
        high_clipped=high.unsqueeze(1).expand_as(mask),
    )
    return Objective(loss=(per_token * batch.loss_weights).sum(), terms=terms, token_mask=mask)
