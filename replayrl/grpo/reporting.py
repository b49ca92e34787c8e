"""What `GRPOTrainer` logs about generations: per-batch generation metrics and the completions table."""

from __future__ import annotations

import torch
from accelerate.utils import gather_object
from torch import Tensor

from replayrl import algos
from replayrl.grpo.rollout import Rollout


def generation_metrics(
    lengths: Tensor, all_truncated: Tensor, all_per_func: Tensor, all_rewards: Tensor, names: list[str], G: int
) -> dict[str, float]:
    """Metrics of one generation batch, from every process's values. ``lengths, all_truncated, all_rewards:
    (N,)``; ``all_per_func: (N, F)`` with NaN where a reward function did not apply."""
    metrics = {
        "completion_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": all_truncated.float().mean().item(),
    }
    for i, name in enumerate(names):
        column = all_per_func[:, i]
        column = column[~column.isnan()]
        if len(column):
            metrics[f"rewards/{name}/mean"] = column.mean().item()
            metrics[f"rewards/{name}/std"] = column.std().item() if len(column) > 1 else 0.0
    metrics["reward"] = all_rewards.nanmean().item()
    metrics["reward_std"] = algos.group_std(all_rewards, G).mean().item()
    metrics["frac_reward_zero_std"] = algos.zero_std_groups(all_rewards, G).float().mean().item()
    return metrics


def completions_table(table: dict[str, list], limit: int | None, unique_prompts: bool) -> list[dict]:
    """Rows of the completions table (TRL's `log_completions`): prompt, completion, reward, advantage and one
    column per reward function. ``unique_prompts``: the first row of each prompt only."""
    rows = [dict(zip(table, values)) for values in zip(*table.values())]
    if unique_prompts:
        seen, kept = set(), []
        for row in rows:
            if row["prompt"] not in seen:
                seen.add(row["prompt"])
                kept.append(row)
        rows = kept
    return rows[:limit] if limit else rows


def format_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    extra = [k for k in rows[0] if k not in ("prompt", "completion")]
    lines = [f"{'prompt':<40} | {'completion':<40} | " + " | ".join(extra)]
    for row in rows:
        values = " | ".join(f"{row[k]:.3f}" if isinstance(row[k], float) else str(row[k]) for k in extra)
        lines.append(f"{str(row['prompt'])[-40:]!r:<40} | {str(row['completion'])[:40]!r:<40} | {values}")
    return "\n".join(lines)


class GRPOMetricsMixin:
    """GRPOTrainer's metric methods (a mixin of the trainer: uses its accelerator, args and _metrics)."""

    def _reduce_means(self, mode: str, sums: dict[str, tuple[Tensor, Tensor]]) -> None:
        """Global means of several (sum, count) pairs with one all-reduce; skipped keys have count 0."""
        if not sums:
            return
        stacked = torch.stack([torch.stack([s.float(), c.float()]) for s, c in sums.values()])
        stacked = self.accelerator.reduce(stacked.to(self.accelerator.device), reduction="sum")
        for key, (total, count) in zip(sums, stacked.tolist()):
            if count > 0:
                self._metrics[mode][key].append(total / count)

    def _log_loss_metrics(self, mode, batch: Rollout, logps, behaviour, entropy, objective) -> None:
        mask = objective.token_mask
        n = mask.sum()
        low, high, kl = objective.terms.low_clipped, objective.terms.high_clipped, objective.kl

        def masked(x: Tensor) -> tuple[Tensor, Tensor]:
            return x.detach().float()[mask].sum(), n

        sums = {"entropy": masked(entropy), "clip_ratio/low_mean": masked(low), "clip_ratio/high_mean": masked(high)}
        sums["clip_ratio/region_mean"] = masked(low | high)
        if kl is not None:
            sums["kl"] = masked(kl)
        if objective.entropy_mask is not None:
            sums["entropy_mask/kept_ratio"] = masked(objective.entropy_mask)
        if objective.off_policy_keep is not None:
            sums["off_policy_mask/kept_ratio"] = masked(objective.off_policy_keep.expand_as(mask))
        sums.update(self._extra_loss_metrics(batch, logps, behaviour, mask))
        self._reduce_means(mode, sums)

    def _extra_loss_metrics(self, batch: Rollout, logps: Tensor, behaviour: Tensor, mask: Tensor) -> dict:
        """Hook: more (sum, count) metrics from the loss pass."""
        return {}

    def _log_generation_metrics(self, mode, all_per_func, all_rewards, completion_mask, prompt_mask, truncated):
        metrics = self._metrics[mode]
        lengths = self.accelerator.gather(completion_mask.sum(1)).float()
        tokens = self.accelerator.gather(completion_mask.sum() + prompt_mask.sum()).sum()
        all_truncated = self.accelerator.gather(truncated)
        if mode == "train":
            self._total_tokens += int(tokens)
            metrics["num_tokens"] = [float(self._total_tokens)]
        names, G = self.reward_funcs.names, self._group_size(mode)
        for key, value in generation_metrics(lengths, all_truncated, all_per_func, all_rewards, names, G).items():
            metrics[key].append(value)

    def _update_entropy_control(self, mode: str, entropy: Tensor, objective) -> None:
        """Adaptive entropy bonus: accumulate the step's token entropies; update the coefficient at the end of
        each optimizer step (from every process's sums)."""
        control = self.entropy_control
        if not control.enabled or mode != "train":
            return
        effective = objective.token_mask if objective.entropy_mask is None else objective.entropy_mask
        control.observe(float((entropy.detach() * effective).sum()), float(effective.sum()))
        if (self._step - 1) % self.args.gradient_accumulation_steps != self.args.gradient_accumulation_steps - 1:
            return
        if control.adaptive:
            totals = torch.tensor(control.window, device=self.accelerator.device)
            total, count = self.accelerator.reduce(totals, reduction="sum").tolist()
            control.end_step(total, count)
        self._metrics[mode]["entropy_coef"].append(control.coef)

    def _print_completions(self) -> None:
        table = {k: gather_object(v) for k, v in self._last_completions.items()}
        self._last_completions = {}
        if not self.accelerator.is_main_process:
            return
        rows = completions_table(table, self.args.num_completions_to_print, self.args.log_unique_prompts)
        print("\n" + format_table(rows))
