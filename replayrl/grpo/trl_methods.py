"""TRL 1.16 `GRPOTrainer` methods and attributes that users call, read or override, on replayrl's own code path.

Thin wrappers over `replayrl.algos` with TRL's names and signatures. `compute_loss` takes its token masks through
`get_high_entropy_mask` and `get_off_policy_mask`, so a subclass that overrides either changes what is trained.
"""

from __future__ import annotations

from torch import Tensor

from replayrl import algos
from replayrl.grpo.objective import Inputs, entropy_pool
from replayrl.models.lm_head import forward_to_head


class TRLMethodsMixin:
    """A mixin of `GRPOTrainer` (uses its `accelerator`, `args` and `entropy_control`)."""

    def _set_trl_attributes(self, args) -> None:
        """Config values TRL's GRPOTrainer also exposes as attributes (read by users' code; not by ours)."""
        self.beta, self.num_iterations, self.loss_type = args.beta, args.num_iterations, args.loss_type
        self.epsilon_low, self.epsilon_high, self.temperature = args.epsilon, args.epsilon_high, args.temperature
        self.scale_rewards, self.multi_objective_aggregation = args.scale_rewards, args.multi_objective_aggregation
        self.importance_sampling_level, self.use_vllm = args.importance_sampling_level, args.use_vllm
        self.max_completion_length, self.pad_to_multiple_of = args.max_completion_length, args.pad_to_multiple_of
        self.mask_truncated_completions = args.mask_truncated_completions
        self.top_entropy_quantile = args.top_entropy_quantile
        self.off_policy_mask_threshold = args.off_policy_mask_threshold
        self.max_tool_calling_iterations = args.max_tool_calling_iterations

    @staticmethod
    def get_off_policy_mask(
        advantages: Tensor,
        per_token_logps: Tensor,
        sampling_per_token_logps: Tensor,
        mask: Tensor,
        off_policy_threshold: float,
    ) -> Tensor:
        """Off-policy sequence mask (DeepSeek-V3.2): ``(B, 1)``, 1 = keep, 0 = drop (negative advantage and mean
        token KL ``sampling - current`` above the threshold). ``advantages: (B, 1)``; the rest ``(B, T)``."""
        return algos.off_policy_sequence_mask(
            advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold
        )

    @staticmethod
    def get_sapo_token_loss(unclipped_token_importance_ratio: Tensor, temperature: float) -> Tensor:
        """SAPO's soft gate per token, ``sigmoid(tau (r - 1)) * 4 / tau`` (arXiv:2511.20347; the loss is
        ``-gate * A``): the function `loss_type="sapo"` trains with. ``unclipped_token_importance_ratio: (B, T)``."""
        return algos.sapo_gate(unclipped_token_importance_ratio, temperature)

    def get_high_entropy_mask(self, entropies: Tensor, mask: Tensor, threshold: float) -> Tensor:
        """Bool ``(B, T)``: the real tokens whose entropy is at or above the ``threshold`` quantile (in [0, 1]) of
        the entropies of every process's real tokens. ``entropies, mask: (B, T)``."""
        pool = entropy_pool(self.accelerator, entropies, mask.bool())
        return algos.entropy_quantile_mask(entropies, mask, threshold, pool)

    def _add_token_masks(self, x: Inputs, mask: Tensor) -> None:
        """The entropy and off-policy masks of a micro-batch (``mask: (B, T)`` bool, its loss tokens)."""
        if self.args.top_entropy_quantile < 1.0:
            x.entropy_mask = self.get_high_entropy_mask(x.entropy, mask, 1.0 - self.args.top_entropy_quantile)
        if self.args.off_policy_mask_threshold is not None:
            advantages = x.batch.advantages.unsqueeze(1)
            threshold = self.args.off_policy_mask_threshold
            x.off_policy_keep = self.get_off_policy_mask(advantages, x.logps, x.behaviour, mask.float(), threshold)

    def _forward_token_stats(
        self, model, input_ids, attention_mask, width: int, with_entropy, entropy_grad, **model_inputs
    ):
        """One forward pass: log-probs ``(N, width)`` of the last ``width`` tokens of ``input_ids`` at the sampling
        temperature, their entropies (or None) and the MoE router aux loss (or None). Only those positions go
        through the LM head, chunk by chunk (`replayrl.models.lm_head`): no full-vocabulary logits are formed.
        `model_inputs`: a VLM's image inputs (``pixel_values``, ``image_grid_thw``, ...)."""
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=width + 1, **model_inputs)
        if self.aux_loss_enabled:  # TRL: ask for the router logits (and so the aux loss) whatever the config says
            inputs["output_router_logits"] = True
        out, head = forward_to_head(model, **inputs)
        stats = head.positions(
            slice(None, -1)
        ).token_stats(  # position t predicts token t + 1
            input_ids[:, -width:],
            temperature=self.args.temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
        )
        return stats.logps, stats.entropy, getattr(out, "aux_loss", None)

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, **kwargs
    ):
        """TRL's signature (`batch_size` chunking is the LM head's own; a VLM's image inputs as keywords, e.g.
        ``pixel_values``, ``image_grid_thw``): (log-probs, entropies or None, aux loss or None). Entropies carry a
        gradient only while the entropy bonus is on, as in TRL."""
        model_inputs = {k: v for k, v in kwargs.items() if v is not None and k != "num_images"}
        return self._forward_token_stats(
            model, input_ids, attention_mask, logits_to_keep, compute_entropy, self._entropy_bonus_enabled,
            **model_inputs,
        )  # fmt: skip

    @property
    def _entropy_bonus_enabled(self) -> bool:
        """TRL's flag: the entropy bonus is on (a non-zero `entropy_coef`, or adaptive control)."""
        return self.entropy_control.enabled

    @_entropy_bonus_enabled.setter
    def _entropy_bonus_enabled(self, value: bool) -> None:
        if bool(value) != self.entropy_control.enabled:
            raise ValueError("_entropy_bonus_enabled follows entropy_coef and use_adaptive_entropy: set those.")

    @property
    def entropy_coef(self) -> float:
        """The entropy bonus coefficient now (moved each optimizer step by the adaptive controller)."""
        return self.entropy_control.coef

    @entropy_coef.setter
    def entropy_coef(self, value: float) -> None:
        self.entropy_control.coef = float(value)

    @property
    def use_adaptive_entropy(self) -> bool:
        return self.entropy_control.adaptive

    @use_adaptive_entropy.setter
    def use_adaptive_entropy(self, value: bool) -> None:
        self.entropy_control.adaptive = bool(value)
