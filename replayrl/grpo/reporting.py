"""What `GRPOTrainer` logs about generations: per-batch generation metrics and the completions table."""

from __future__ import annotations

from torch import Tensor

from replayrl import algos


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
