"""What `GRPOTrainer` logs about generations: per-batch generation metrics and the completions table."""

from __future__ import annotations

from collections import defaultdict, deque

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
        values = " | ".join(_cell(k, row[k]) for k in extra)
        lines.append(f"{str(row['prompt'])[-40:]!r:<40} | {str(row['completion'])[:40]!r:<40} | {values}")
    return "\n".join(lines)


def _cell(column: str, value) -> str:
    if column == "image":  # a row's images, printed as their sizes
        return "[" + ", ".join(f"{im.width}x{im.height}" for im in value or []) + "]"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


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
        if self.entropy_control.enabled:  # TRL: the loss before the entropy bonus, per optimizer step
            steps = self.args.gradient_accumulation_steps if mode == "train" else 1
            sums["policy_loss"] = (objective.policy_loss * steps, torch.ones((), device=objective.policy_loss.device))
        self._reduce_means(mode, sums)

    def _model_card_figures(self) -> dict:
        """The model card's headline figures beyond metrics.jsonl (replayrl.model_card)."""
        return {"completions generated": getattr(self, "_completions_generated", 0)}

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
            self._completions_generated = getattr(self, "_completions_generated", 0) + lengths.numel()
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

    # ------------------------------------------------------------------ reward functions that log (TRL's kwargs)
    def _reward_logging_kwargs(self) -> dict:
        """TRL's ``log_extra(column, values)`` and ``log_metric(name, value)``, passed to every reward function."""
        return {"log_extra": self._log_completion_extra, "log_metric": self._log_metric}

    def _pending_logs(self) -> tuple[dict[str, list], dict[str, list]]:
        if "_pending_extra_logs" not in self.__dict__:
            self._pending_extra_logs, self._pending_metrics = defaultdict(list), defaultdict(list)
        return self._pending_extra_logs, self._pending_metrics

    def _log_completion_extra(self, column: str, values: list) -> None:
        """An extra column of the completions table: one value per completion of this process's batch."""
        self._pending_logs()[0][column].extend(values)

    def _log_metric(self, name: str, value: float) -> None:
        """A scalar metric: averaged over the calls and processes of the logging period, logged under ``name``."""
        self._pending_logs()[1][name].append(float(value))

    def _flush_reward_metrics(self, mode: str) -> None:
        """Every process's ``log_metric`` values into ``_metrics`` (one mean per name). Names are gathered and
        sorted so that every process reduces the same names in the same order."""
        pending = self._pending_logs()[1]
        names = sorted(set(gather_object(list(pending)))) if self.accelerator.num_processes > 1 else sorted(pending)
        for name in names:
            values = pending.get(name, [])
            local = torch.tensor([sum(values), len(values)], dtype=torch.float32, device=self.accelerator.device)
            total, count = self.accelerator.reduce(local, reduction="sum").tolist()
            if count > 0:
                self._metrics[mode][name].append(total / count)
        pending.clear()

    def _flush_extra_columns(self, n: int) -> dict[str, list]:
        """This process's ``log_extra`` columns, by name (all None where another process logged the column and this
        one did not). Names are gathered so that every process has the same columns."""
        pending = self._pending_logs()[0]
        columns = sorted(set(gather_object(list(pending)))) if self.accelerator.num_processes > 1 else sorted(pending)
        local = {column: list(pending.get(column, [None] * n)) for column in columns}
        pending.clear()
        return local

    def _record_completions(self, mode, prompts, completions, rewards, advantages, per_func, images=None) -> None:
        """After scoring: reward-function metrics into ``_metrics``; with ``log_completions`` the completions table
        (this process's rows in ``_last_completions``, every process's in TRL's ``_logs``). ``images``: the prompt
        images of each group (`prompt_images`), shown in an ``image`` column with ``log_multimodal`` (as TRL)."""
        self._flush_reward_metrics(mode)
        extras = self._flush_extra_columns(len(completions))
        if not self.args.log_completions:
            return
        table = {"prompt": prompts, "completion": completions, "reward": rewards.tolist()}
        table["advantage"] = advantages.tolist()
        for i, name in enumerate(self.reward_funcs.names):
            table[name] = per_func[:, i].tolist()
        if images is not None and getattr(self.args, "log_multimodal", True):
            group = len(completions) // len(images)
            table["image"] = [images[i // group] for i in range(len(completions))]
            self._completion_logs()["images"].extend(gather_object(table["image"]))
        self._last_completions = {**table, **extras}
        logs = self._completion_logs()
        for key in ("prompt", "completion"):
            logs[key].extend(gather_object(list(table[key])))
        logs["advantages"].extend(self.accelerator.gather(advantages).tolist())
        for name in self.reward_funcs.names:
            logs["rewards"][name].extend(gather_object(table[name]))
        for column, values in extras.items():
            logs["extra"][column].extend(gather_object(values))

    def _completion_logs(self) -> dict:
        """TRL's ``_logs``: the last generation batch of every process (prompt, completion, rewards per function,
        advantages, extra columns, and the images of image prompts)."""
        if "_logs" not in self.__dict__:
            size = self.accelerator.num_processes * self.args.per_device_train_batch_size
            size *= self.args.steps_per_generation

            def column():
                return deque(maxlen=size)

            self._logs = {"prompt": column(), "completion": column(), "advantages": column(), "images": column()}
            self._logs.update(rewards=defaultdict(column), extra=defaultdict(column))
        return self._logs

    def _print_completions(self) -> dict[str, list] | None:
        """Print the completions table (every process's rows); returns it on the main process, else None."""
        table = {k: gather_object(v) for k, v in self._last_completions.items()}
        self._last_completions = {}
        if not self.accelerator.is_main_process:
            return None
        rows = completions_table(table, self.args.num_completions_to_print, self.args.log_unique_prompts)
        print("\n" + format_table(rows))
        if self.args.log_unique_prompts:  # the trackers get every row, one per prompt with this flag (as TRL)
            kept = completions_table(table, None, True)
            table = {k: [row[k] for row in kept] for k in table}
        return table
