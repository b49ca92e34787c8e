"""DAPO dynamic sampling (arXiv:2503.14476, section 3.2): over-sample prompts and keep only the groups whose rewards
vary, until the generation batch is full, within a bounded number of generation rounds.

verl calls it `algorithm.filter_groups` (`enable`, `max_num_gen_batches`); TRL has an open request (#3708). Here:
`GRPOConfig.dynamic_sampling`, `dynamic_sampling_max_rounds`, `dynamic_sampling_on_exhausted`. The first round is the
dataloader's batch; each extra round generates a batch of the same size for prompts drawn from the training set by
a generator seeded from (seed, optimizer step, round, process), so a resumed run draws the same prompts without any
saved state. Pure selection logic (`dynamic_sample`) plus the trainer-facing `fill_with_informative_groups`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from replayrl import algos
from replayrl.grpo.rollout import Rollout


@dataclass
class DynamicSamplingResult:
    rollout: Rollout  # exactly `needed` groups
    rounds: int  # generation rounds run (1 = no extra round)
    discarded: int  # groups generated but not trained on (this process): zero-std ones, and extras past the batch
    filled: int  # zero-std groups kept because the rounds ran out (this process)
    generated: int  # completions generated (this process)


def select_groups(rollouts: list[Rollout], G: int, needed: int, atol: float) -> tuple[list[Rollout], list[Rollout]]:
    """Split the groups of `rollouts` (in generation order) into (informative, zero-std); the informative list is
    cut at `needed` groups. Each element is one group of G rows."""
    informative, flat = [], []
    for rollout in rollouts:
        zero = algos.zero_std_groups(rollout.rewards, G, atol).tolist()
        for g, is_zero in enumerate(zero):
            group = rollout.rows(slice(g * G, (g + 1) * G))
            (flat if is_zero else informative).append(group)
    return informative[:needed], flat


def refill_prompts(dataset, num_prompts: int, G: int, seed: int, step: int, round_: int, rank: int) -> list[dict]:
    """`num_prompts` rows of `dataset` drawn without replacement (with replacement past the dataset's size), each
    repeated G times in a row, as the training sampler lays them out. Deterministic in its arguments."""
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise ValueError(
            f"dynamic_sampling draws extra prompts by index, which a {type(dataset).__name__} does not allow: use a "
            "map-style dataset (datasets.Dataset) or set dynamic_sampling=False."
        )
    generator = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1009 + round_) * 131 + rank)
    n = len(dataset)
    order = torch.cat([torch.randperm(n, generator=generator) for _ in range(-(-num_prompts // n))])[:num_prompts]
    rows = [dataset[int(i)] for i in order]
    return [row for row in rows for _ in range(G)]


def dynamic_sample(
    first: Rollout,
    generate_round: Callable[[int], Rollout],
    any_short: Callable[[int], bool],
    G: int,
    max_rounds: int,
    on_exhausted: str,
    atol: float,
    pad_token_id: int,
) -> DynamicSamplingResult:
    """Keep the informative groups of `first` and of up to `max_rounds - 1` more rounds (`generate_round(r)`) until
    there are as many as `first` has groups. `any_short(missing)` says whether any process still misses groups (all
    processes must run the same rounds, since generation gathers across them). When the rounds run out, the batch is
    filled with the zero-std groups in generation order (`on_exhausted="fill"`) or a ValueError is raised ("raise").
    """
    needed = first.num_rows // G
    rounds = [first]
    informative, flat = select_groups(rounds, G, needed, atol)
    while any_short(needed - len(informative)) and len(rounds) < max_rounds:
        rounds.append(generate_round(len(rounds)))
        informative, flat = select_groups(rounds, G, needed, atol)
    missing = needed - len(informative)
    if missing > 0 and on_exhausted == "raise":
        raise ValueError(
            f"Dynamic sampling found {len(informative)} of {needed} groups with reward variance after "
            f"dynamic_sampling_max_rounds={max_rounds} rounds. Raise dynamic_sampling_max_rounds, or set "
            "dynamic_sampling_on_exhausted='fill' to train on zero-std groups (or let a replay buffer fill them)."
        )
    filled = flat[: max(missing, 0)]
    groups = informative + filled
    rollout = groups[0] if len(groups) == 1 else Rollout.concat(groups, pad_token_id=pad_token_id)
    generated = sum(r.num_rows for r in rounds)
    return DynamicSamplingResult(rollout, len(rounds), generated // G - len(groups), len(filled), generated)


def metrics_tensor(result: DynamicSamplingResult, device) -> Tensor:
    """(rounds, discarded, filled, generated) as floats, to be summed across processes (rounds: divided after)."""
    values = [result.rounds, result.discarded, result.filled, result.generated]
    return torch.tensor([float(v) for v in values], device=device)


def metric_values(totals: list[float], num_processes: int) -> dict[str, float]:
    """`dynamic_sampling/*` metrics from the process-summed `metrics_tensor` (rounds are the same everywhere)."""
    rounds, discarded, filled, generated = totals
    return {
        "dynamic_sampling/rounds": rounds / num_processes,
        "dynamic_sampling/groups_discarded": discarded,
        "dynamic_sampling/groups_filled": filled,
        "dynamic_sampling/completions": generated,
    }


def fill_with_informative_groups(trainer, rollout: Rollout, inputs: list[dict]) -> Rollout:
    """The trainer's side of dynamic sampling: extra rounds through `trainer._generate_and_score`, one collective
    per round to agree on whether to go on, and the `dynamic_sampling/*` metrics. `rollout` is the first round."""
    args, accelerator = trainer.args, trainer.accelerator
    G, step, rank = trainer.num_generations, trainer.state.global_step, accelerator.process_index
    device = rollout.rewards.device

    def generate_round(r: int) -> Rollout:
        more = refill_prompts(trainer.train_dataset, len(inputs) // G, G, args.seed, step, r, rank)
        return trainer._generate_and_score(more, mode="train")

    def any_short(missing: int) -> bool:
        return bool(accelerator.reduce(torch.tensor(max(missing, 0), device=device), reduction="sum") > 0)

    result = dynamic_sample(
        rollout,
        generate_round,
        any_short,
        G,
        max_rounds=args.dynamic_sampling_max_rounds,
        on_exhausted=args.dynamic_sampling_on_exhausted,
        atol=getattr(args, "replay_zero_std_atol", 1e-6),
        pad_token_id=trainer.generation_config.pad_token_id,
    )
    totals = accelerator.reduce(metrics_tensor(result, device), reduction="sum")
    for name, value in metric_values(totals.tolist(), accelerator.num_processes).items():
        trainer._metrics["train"][name].append(value)
    return result.rollout
