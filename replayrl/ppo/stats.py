"""TRL v0.7.1's PPO stats dictionary: per mini-batch training stats, the per-step record, gathering across processes.

Scalars are Python floats; TRL v0.7.1's distributions (``objective/kl_dist``, ``tokens/queries_dist``, ...) are
1-D tensors, kept for trackers that draw histograms and left out of metrics.jsonl.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor

from replayrl.algos import ppo as F


def _var(values: Tensor, mask: Tensor) -> float:
    """Unbiased masked variance, 0 when fewer than two tokens (a logged number must not raise)."""
    return F.masked_var(values, mask).item() if mask.sum() >= 2 else 0.0


@torch.no_grad()
def minibatch_stats(out, old: dict[str, Tensor], mask: Tensor, ratio: Tensor, losses: dict[str, Tensor]) -> dict:
    """Stats of one mini-batch (keys without the ``ppo/`` prefix); ``out`` is the current forward pass."""
    approxkl, policykl = F.approx_kl(out.logprobs, old["logprobs"], mask)
    vpreds, returns = out.values, old["returns"]
    return {
        "loss/policy": losses["policy"].item(),
        "loss/value": losses["value"].item(),
        "loss/total": losses["total"].item(),
        "policy/entropy": F.masked_mean(out.entropy, mask).item(),
        "policy/approxkl": approxkl.item(),
        "policy/policykl": policykl.item(),
        "policy/clipfrac": losses["pg_clipfrac"].item(),
        "policy/advantages": old["advantages"].detach()[mask.bool()].cpu(),  # TRL v0.7.1's distribution
        "policy/advantages_mean": F.masked_mean(old["advantages"], mask).item(),
        "policy/ratio_mean": F.masked_mean(ratio, mask).item(),
        "policy/ratio": ratio.detach()[mask.bool()].cpu(),
        "returns/mean": F.masked_mean(returns, mask).item(),
        "returns/var": _var(returns, mask),
        "val/vpred": F.masked_mean(vpreds, mask).item(),
        "val/error": F.masked_mean((vpreds - returns).square(), mask).item(),
        "val/clipfrac": losses["vf_clipfrac"].item(),
        "val/mean": F.masked_mean(old["values"], mask).item(),
        "val/var": _var(old["values"], mask),
    }


def step_stats(data: dict[str, Tensor], non_score: Tensor, train_stats: list[dict], kl_coef: float, queries, responses):
    """TRL v0.7.1's `record_step_stats`: objective/*, ppo/* (means over mini-batches), tokens/*."""
    mask = data["mask"]
    kl_list = (data["kls"] * mask).sum(-1)
    scores = data["scores"]
    query_lens = torch.tensor([len(q) for q in queries], dtype=torch.float32)
    response_lens = torch.tensor([len(r) for r in responses], dtype=torch.float32)
    stats = {
        "objective/kl": kl_list.mean().item(),
        "objective/kl_dist": kl_list.cpu(),
        "objective/logprobs": data["logprobs"].cpu(),
        "objective/ref_logprobs": data["ref_logprobs"].cpu(),
        "objective/kl_coef": kl_coef,
        "objective/entropy": (-data["logprobs"] * mask).sum(-1).mean().item(),
        "ppo/mean_non_score_reward": non_score.sum(-1).mean().item(),
        "ppo/mean_scores": scores.mean().item(),
        "ppo/std_scores": scores.std().item() if scores.numel() > 1 else 0.0,
        "tokens/queries_len_mean": query_lens.mean().item(),
        "tokens/queries_len_std": query_lens.std().item() if len(queries) > 1 else 0.0,
        "tokens/queries_dist": query_lens,
        "tokens/responses_len_mean": response_lens.mean().item(),
        "tokens/responses_len_std": response_lens.std().item() if len(responses) > 1 else 0.0,
        "tokens/responses_dist": response_lens,
    }
    collected = defaultdict(list)
    for minibatch in train_stats:
        for key, value in minibatch.items():
            collected[key].append(value)
    for key, values in collected.items():
        stats[f"ppo/{key}"] = torch.cat(values) if isinstance(values[0], Tensor) else sum(values) / len(values)
    returns_var = stats["ppo/returns/var"]
    stats["ppo/val/var_explained"] = 1 - stats["ppo/val/error"] / returns_var if returns_var > 0 else float("nan")
    return stats


def gather_stats(accelerator, stats: dict) -> dict:
    """Scalar stats averaged over processes (distributions stay local); a no-op on one process."""
    if accelerator.num_processes == 1:
        return stats
    keys = [k for k, v in stats.items() if isinstance(v, float)]
    values = torch.tensor([stats[k] for k in keys], dtype=torch.float64, device=accelerator.device)
    reduced = accelerator.reduce(values, reduction="mean").tolist()
    return {**stats, **dict(zip(keys, reduced))}


def log_stats_record(stats: dict, rewards: Tensor) -> dict[str, float]:
    """What `log_stats` sends: every scalar stat, env/reward_mean and env/reward_std, and ``reward`` (the
    house's cross-trainer name for the mean reward, read by `replayrl.metrics.summary_lines`)."""
    record = {k: v for k, v in stats.items() if isinstance(v, (int, float))}
    record["env/reward_mean"] = rewards.mean().item()
    record["env/reward_std"] = rewards.std().item() if rewards.numel() > 1 else 0.0
    record["reward"] = record["env/reward_mean"]
    return record
