"""TRL v0.7.1's PPOTrainer's overridable math methods: `_kl_penalty`, `compute_rewards`,
`compute_advantages` and `loss`, with v0.7.1's signatures and return values. `PPOTrainer.step` goes through
them, so a subclass that overrides one changes the update. The formulas are `replayrl.algos.ppo`'s. Also v0.7.1's
`prepare_model_inputs` and `batched_forward_pass`, the padded batch and the no-grad forward pass `step` uses.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from replayrl.algos import entropy_from_logits
from replayrl.algos import ppo as F
from replayrl.ppo.batch import ForwardOutput, batch_to, build_batch, forward
from replayrl.ppo.stats import minibatch_stats


class PPOSeedMethodsMixin:
    """Needs `config` (PPOConfig), `kl_ctl`, `accelerator`, `tokenizer`, `model`, `is_encoder_decoder` and
    `_reduce_sum` (a sum over processes)."""

    def _build_batch(self, queries: list[Tensor], responses: list[Tensor], response_masks=None):
        """The padded batch of `step` (`replayrl.ppo.batch`, or `replayrl.ppo.seq2seq_batch` for an
        encoder-decoder), on the CPU."""
        pad = self.tokenizer.pad_token_id
        if not self.is_encoder_decoder:
            return build_batch([q.cpu() for q in queries], [r.cpu() for r in responses], pad, response_masks)
        from replayrl.ppo.seq2seq_batch import build_seq2seq_batch

        config = self.accelerator.unwrap_model(self.model).config
        start = config.decoder_start_token_id if config.decoder_start_token_id is not None else pad
        return build_seq2seq_batch(queries, responses, pad, start, response_masks)

    def prepare_model_inputs(self, queries: list[Tensor], responses: list[Tensor]) -> dict[str, Tensor]:
        """TRL v0.7.1's padded model inputs of ``queries`` and ``responses`` (on the accelerator's device):
        decoder-only ``input_ids, attention_mask, position_ids (B, Q + R)`` (left-padded queries, right-padded
        responses, positions counting real tokens); encoder-decoder ``input_ids, attention_mask (B, Q)`` and
        ``decoder_input_ids, decoder_attention_mask (B, D)``."""
        batch = self._build_batch(queries, responses)
        fields = ("input_ids", "attention_mask")
        fields += ("decoder_input_ids", "decoder_attention_mask") if self.is_encoder_decoder else ("position_ids",)
        return {name: getattr(batch, name).to(self.accelerator.device) for name in fields}

    @torch.no_grad()
    def batched_forward_pass(
        self, model, queries, responses, model_inputs: dict, return_logits: bool = False, response_masks=None
    ):
        """TRL v0.7.1's ``(logprobs, logits or None, values, masks)`` of ``model`` over ``queries`` and
        ``responses``, ``config.mini_batch_size`` rows per forward pass, without gradients. Per-token tensors are
        ``(B, R)`` over the response tokens (v0.7.1: the whole padded sequence; the masked values are the same);
        ``logits`` ``(B, R, V)`` only with ``return_logits``. ``model_inputs`` must be
        ``prepare_model_inputs(queries, responses)``'s (checked: the batch is rebuilt from the tensors)."""
        batch = batch_to(self._build_batch(queries, responses, response_masks), self.accelerator.device)
        if not torch.equal(model_inputs["input_ids"].to(batch.input_ids.device), batch.input_ids):
            raise ValueError(
                "model_inputs are not prepare_model_inputs(queries, responses)'s: pass "
                "model_inputs=trainer.prepare_model_inputs(queries, responses) for the same queries and responses."
            )
        was_training = model.training
        model.eval()
        parts = []
        try:
            for start in range(0, len(queries), self.config.mini_batch_size):
                rows = torch.arange(start, min(start + self.config.mini_batch_size, len(queries)))
                part = forward(model, batch.select(rows.to(batch.input_ids.device)), self.config.temperature,
                               keep_logits=return_logits)  # fmt: skip
                parts.append((part, batch.response_mask[rows.to(batch.input_ids.device)]))
        finally:
            model.train(was_training)
        return _concat_parts(parts, batch.response_mask.shape[1], return_logits)

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


def _concat_parts(parts: list, width: int, with_logits: bool):
    """Chunks of `batched_forward_pass` padded back to the batch's response width ``width`` and concatenated."""

    def cat(tensors: list[Tensor]) -> Tensor:
        return torch.cat(
            [torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1])) for t in tensors]
        )

    outs = [p for p, _ in parts]
    logits = cat([o.logits for o in outs]) if with_logits else None
    return cat([o.logprobs for o in outs]), logits, cat([o.values for o in outs]), cat([m for _, m in parts])
