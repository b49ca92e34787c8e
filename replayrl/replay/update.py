"""TRL's replay-step methods on the replay trainer: `update_with_replay_buffer`, `update_replay_buffer`,
`sample_from_replay_buffer`, `slice_group_data`, with TRL's signatures (the GRPOWithReplayBuffer PR's names).

`update_with_replay_buffer` is the training path: after each generation batch is scored the trainer calls it
(`GRPOWithReplayBufferTrainer._replace_zero_std_groups`), so a subclass that overrides it changes what is trained
on. Where replayrl differs from TRL (docs/deviations.md): with replayrl's own buffer, groups enter the buffer after
their first loss pass (their behaviour log-probs are then known), not inside this call; a buffer holding TRL-style
dict items (``ReplayBuffer(max_size=...)``, or TRL's own class) is filled here, as TRL does.
"""

from __future__ import annotations

from torch import Tensor

from replayrl.data.vision import text_tokenizer
from replayrl.replay.group_swap import LOGP_FIELDS, VISION_FIELDS, group_item, per_group_std, swap_groups, trim_group


class TRLReplayMethodsMixin:
    """TRL's `GRPOWithReplayBufferTrainer` methods; needs `replay_buffer`, `num_generations`, `processing_class`."""

    _pending_picks: list | None = None  # the training path's picks for this batch's zero-std groups, in order
    _replay_assignment: dict | None = None  # group index -> buffered group, filled by the default implementation

    def update_with_replay_buffer(
        self,
        group_advantages: Tensor,
        group_std_rewards: Tensor,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion_ids: Tensor,
        completion_mask: Tensor,
        forward_kwargs: dict,
        num_items_in_batch: int,
        old_per_token_logps: Tensor | None = None,
        ref_per_token_logps: Tensor | None = None,
        importance_sampling_ratio: float | None = None,
    ) -> dict | None:
        """Swap the batch's zero-std groups for buffered groups; None when nothing was swapped (TRL's contract).

        group_advantages: (num_groups, G) or (B,); group_std_rewards: one std per group (see
        `group_swap.per_group_std` for the accepted layouts); prompt_ids/prompt_mask (B, P) left-padded;
        completion_ids/completion_mask and the log-probs (B, C) right-padded. Groups with variance are added to
        a TRL-style buffer (score sum_i |A_i| * std, TRL's). Returns TRL's dict: the four id/mask tensors at the
        widest of the batch's and the buffered groups' widths, `advantages` (num_groups, G), the log-prob and
        vision fields present, `num_items_in_batch` (and `importance_sampling_ratio` when given).
        """
        if self.replay_buffer is None or self.replay_buffer.max_size <= 0:
            return None
        G = self.num_generations
        advantages = group_advantages.reshape(-1, G)
        with_variance = per_group_std(group_std_rewards, G) > 0
        self.update_replay_buffer(
            with_variance,
            advantages,
            group_std_rewards,
            prompt_ids,
            prompt_mask,
            completion_ids,
            completion_mask,
            forward_kwargs,
            list(VISION_FIELDS),
            old_per_token_logps,
            ref_per_token_logps,
            importance_sampling_ratio,
        )
        to_replace = (~with_variance).nonzero().flatten().tolist()
        if not to_replace:
            return None
        sampled = self.sample_from_replay_buffer(len(to_replace), list(VISION_FIELDS), list(LOGP_FIELDS))
        n = len(sampled["prompt_ids"])
        if n == 0:  # empty buffer: nothing to swap in
            return None
        items = [{k: v[i] for k, v in sampled.items() if len(v) > i} for i in range(n)]
        batch = _batch_dict(
            prompt_ids, prompt_mask, completion_ids, completion_mask, advantages, forward_kwargs,
            old_per_token_logps, ref_per_token_logps,
        )  # fmt: skip
        out = swap_groups(batch, to_replace[:n], items, G, text_tokenizer(self.processing_class).pad_token_id)
        out = {k: v for k, v in out.items() if v is not None}
        out["num_items_in_batch"] = num_items_in_batch
        if importance_sampling_ratio is not None:
            out["importance_sampling_ratio"] = importance_sampling_ratio
        if self._pending_picks is not None:
            self._replay_assignment = dict(zip(to_replace[:n], self._pending_picks))
        return out

    def update_replay_buffer(
        self,
        groups_with_variance: Tensor,
        group_advantages: Tensor,
        group_std_rewards: Tensor,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion_ids: Tensor,
        completion_mask: Tensor,
        forward_kwargs: dict,
        optional_vision_fields: list[str] | None = None,
        old_per_token_logps: Tensor | None = None,
        ref_per_token_logps: Tensor | None = None,
        importance_sampling_ratio: float | None = None,
    ) -> None:
        """Add the groups with variance (groups_with_variance: (num_groups,) bool) to a TRL-style buffer as
        trimmed dict items scored sum_i |A_i| * std. replayrl's own buffer is filled after the first loss pass
        instead (`_after_first_pass`), so this does nothing for it."""
        if not getattr(self.replay_buffer, "trl_style", True) or not bool(groups_with_variance.any()):
            return
        G = self.num_generations
        advantages = group_advantages.reshape(-1, G)
        vision = {k: v for k, v in forward_kwargs.items() if k in (optional_vision_fields or [])}
        batch = _batch_dict(
            prompt_ids, prompt_mask, completion_ids, completion_mask, advantages, vision,
            old_per_token_logps, ref_per_token_logps,
        )  # fmt: skip
        groups = groups_with_variance.nonzero().flatten().tolist()
        std = per_group_std(group_std_rewards, G)
        scores = [float(advantages[g].abs().sum() * std[g]) for g in groups]
        items = [group_item(batch, g, G) for g in groups]
        if importance_sampling_ratio is not None:
            for item in items:
                item["importance_sampling_ratio"] = importance_sampling_ratio
        self.replay_buffer.add(scores, items)

    def sample_from_replay_buffer(
        self, num_samples: int, optional_vision_fields: list[str] | None = None, optional_tensor_fields=None
    ) -> dict[str, list]:
        """`num_samples` buffered groups as TRL's dict of lists (prompt_ids, prompt_mask, completion_ids,
        completion_mask, advantages, and the optional fields the items carry). Fewer (or none) when replayrl's
        buffer holds fewer distinct groups. In training, the groups drawn for this batch (the same draw on
        every process) are used."""
        if self._pending_picks is not None:
            picked = self._pending_picks[:num_samples]
        else:
            picked = self.replay_buffer.sample(num_samples=num_samples) or []
        items = [p if isinstance(p, dict) else _rollout_item(p.rollout) for p in picked]
        keys = ["prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages"]
        optional = [*(optional_tensor_fields or []), *(optional_vision_fields or [])]
        keys += [k for k in optional if items and k in items[0]]
        return {k: [item[k] for item in items if k in item] for k in keys}

    def slice_group_data(self, data: Tensor, mask: Tensor, group_idx: int) -> tuple[Tensor, Tensor]:
        """Rows of group `group_idx` of data/mask (B, W), trimmed to the columns holding real tokens (TRL's
        helper; replayrl trims a left-padded prompt on the left, where TRL cuts its last columns)."""
        G = self.num_generations
        rows = slice(group_idx * G, (group_idx + 1) * G)
        left_padded = bool((mask[rows, 0] == 0).any() and mask[rows, -1].all())
        side = "left" if left_padded else "right"
        return trim_group(data[rows], mask[rows], side), trim_group(mask[rows], mask[rows], side)


def _batch_dict(prompt_ids, prompt_mask, completion_ids, completion_mask, advantages, extra, old, ref) -> dict:
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
    }
    batch.update({k: v for k, v in extra.items() if k in VISION_FIELDS})
    return batch


def _rollout_item(rollout) -> dict:
    """A replayrl buffered group (a trimmed `Rollout`) as TRL's item dict."""
    item = {
        "prompt_ids": rollout.prompt_ids,
        "prompt_mask": rollout.prompt_mask,
        "completion_ids": rollout.completion_ids,
        "completion_mask": rollout.completion_mask,
        "advantages": rollout.advantages.tolist(),
    }
    if rollout.old_logps is not None:
        item["old_per_token_logps"] = rollout.old_logps
    if rollout.ref_logps is not None:
        item["ref_per_token_logps"] = rollout.ref_logps
    return item
