"""GRESO-style prompt skipping (arXiv:2506.02177): skip, before generating it, a prompt whose recent groups all had
zero reward variance, and generate another prompt in its place.

GRESO's observation: a prompt whose G completions all got the same reward (all right, or all wrong) in one epoch is
likely to do so again in the next, and generating it again buys a group with zero advantage. Per prompt we keep the
streak z of its most recent consecutive zero-std groups; when the sampler draws it again it is skipped with
probability `1 - max(p ** z, 0.01)` (a prompt with variance last time, or never seen, is never skipped; after a
long streak it is still generated one time in a hundred: prompts change as the policy does). `p` (GRESO's
exploration probability, `prompt_skipping_explore`) adapts each generation batch: down by 0.01 (skip more) while the
share of zero-std groups generated is at or above `prompt_skipping_target_zero_std`, up by 0.01 otherwise, within
[0.05, 0.95] (GRESO's defaults). GRESO keeps one `p` for all-right and one for all-wrong prompts, each with its own
target; rewards here are not assumed binary, so there is one streak and one `p` (docs/deviations.md).

The batch stays full: a skipped prompt is replaced by prompts drawn from the training set in a seeded order (the
same seed, optimizer step and process give the same draws, so a resumed run draws the same prompts), each put to
the same test; when one pass of candidates cannot fill the batch, the rejected prompts with the lowest skip
probability are generated anyway. Only the prompts generated cost completions; the skipped ones cost nothing.

`PromptHistory` and `select_prompts` are plain Python and torch; `skip_prompts` / `record_groups` are the trainer's
side (`GRPOTrainer._generate_training_batch`). The history is in the checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from replayrl import algos

FLOOR = 0.01  # a prompt is generated with probability >= this whatever its streak (GRESO)
EXPLORE_MIN, EXPLORE_MAX, EXPLORE_STEP = 0.05, 0.95, 0.01  # GRESO's bounds and step for p
MAX_CANDIDATES_PER_GROUP = 64  # replacement candidates tested per group of the batch, at most


def prompt_key(row: dict) -> str:
    """Identity of a dataset row's prompt: its `prompt` value as JSON (a string, or a conversation)."""
    return json.dumps(row["prompt"], sort_keys=True, default=str)


class PromptHistory:
    """Per prompt: the streak of its most recent consecutive zero-std groups and its last group's mean reward; and the
    exploration probability `explore` (GRESO's p). The same records on every process give the same history."""

    def __init__(self, explore: float, target_zero_std: float | None):
        self.explore, self.target_zero_std = float(explore), target_zero_std
        self.streak: dict[str, int] = {}
        self.last_mean: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self.streak)

    def skip_probability(self, key: str) -> float:
        """1 - max(p ** z, 0.01) for a streak z >= 1; 0 for a prompt never seen or whose last group had variance."""
        z = self.streak.get(key, 0)
        return 0.0 if z == 0 else 1.0 - max(self.explore**z, FLOOR)

    def record(self, key: str, zero_std: bool, mean_reward: float) -> None:
        self.streak[key] = self.streak.get(key, 0) + 1 if zero_std else 0
        self.last_mean[key] = float(mean_reward)

    def adapt(self, frac_zero_std: float) -> None:
        """GRESO's controller: skip more (p down) while the zero-std share is at or above the target, less otherwise."""
        if self.target_zero_std is None:
            return
        if frac_zero_std >= self.target_zero_std:
            self.explore = max(self.explore - EXPLORE_STEP, EXPLORE_MIN)
        else:
            self.explore = min(self.explore + EXPLORE_STEP, EXPLORE_MAX)

    def state_dict(self) -> dict:
        keys = list(self.streak)
        return {
            "explore": self.explore,
            "keys": keys,
            "streak": [self.streak[k] for k in keys],
            "last_mean": [self.last_mean.get(k, 0.0) for k in keys],
        }

    def load_state_dict(self, state: dict) -> None:
        self.explore = float(state["explore"])
        self.streak = dict(zip(state["keys"], (int(z) for z in state["streak"])))
        self.last_mean = dict(zip(state["keys"], (float(m) for m in state["last_mean"])))


@dataclass
class Selection:
    rows: list[dict]  # one row per group to generate (the batch's size)
    keep_probs: list[float]  # per row: the probability its test let it through (1 - skip probability)
    generated_drawn: list[bool]  # per group of the sampler's draw: generated (True) or skipped
    replacements: int  # prompts generated that the sampler did not draw
    filled: int  # prompts generated although their test said skip (the candidates ran out)


def select_prompts(
    drawn: list[dict], history: PromptHistory, pool: Iterable[dict], generator: torch.Generator
) -> Selection:
    """Which prompts to generate: each of `drawn` (one row per group) passes unless its skip test fires; the gaps are
    filled from `pool` (rows in a seeded order; prompts already tested are passed over), each candidate tested the
    same way, at most MAX_CANDIDATES_PER_GROUP per group; if still short, the rejected prompts of lowest skip
    probability (then in test order) are generated anyway. One uniform draw from `generator` per test."""
    needed = len(drawn)
    kept: list[tuple[int, dict]] = []  # (test order, row)
    rejected: list[tuple[float, int, dict]] = []  # (skip probability, test order, row)
    seen: set[str] = set()

    def test(row: dict) -> bool:
        key = prompt_key(row)
        seen.add(key)
        p = history.skip_probability(key)
        order = len(kept) + len(rejected)
        if float(torch.rand((), generator=generator)) < p:
            rejected.append((p, order, row))
            return False
        kept.append((order, row))
        return True

    for row in drawn:
        test(row)
    budget = MAX_CANDIDATES_PER_GROUP * needed
    for row in pool:
        if len(kept) >= needed or budget <= 0:
            break
        if prompt_key(row) not in seen:
            budget -= 1
            test(row)
    fill = sorted(rejected, key=lambda r: (r[0], r[1]))[: needed - len(kept)]
    orders = {o for o, _ in kept} | {o for _, o, _ in fill}
    rows = [row for _, row in kept] + [row for _, _, row in fill]
    keep_probs = [1.0 - history.skip_probability(prompt_key(row)) for row in rows]
    generated_drawn = [i in orders for i in range(len(drawn))]
    replacements = len(rows) - sum(generated_drawn)
    assert len(rows) == needed
    return Selection(rows, keep_probs, generated_drawn, replacements, len(fill))


def dataset_pool(dataset, generator: torch.Generator, columns: list[str]) -> Iterator[dict]:
    """The rows of a map-style `dataset` in an order drawn from `generator`, read lazily, with the dataloader's
    `columns` (with `remove_unused_columns=True` it drops the others)."""
    for index in torch.randperm(len(dataset), generator=generator).tolist():
        row = dataset[index]
        yield {k: row[k] for k in columns if k in row}


def validate_config(args) -> None:
    """GRPOConfig's checks of the prompt-skipping fields (ValueError naming the fix)."""
    checks = [
        (
            0 < args.prompt_skipping_explore <= 1,
            f"prompt_skipping_explore must be in (0, 1] (got {args.prompt_skipping_explore}); GRESO: 0.5.",
        ),
        (
            args.prompt_skipping_target_zero_std is None or 0 <= args.prompt_skipping_target_zero_std <= 1,
            "prompt_skipping_target_zero_std must be in [0, 1] or None "
            f"(got {args.prompt_skipping_target_zero_std}); GRESO: 0.25.",
        ),
        (
            not (args.prompt_skipping and args.async_generation),
            "prompt_skipping=True with async_generation=True is not supported: the worker generates ahead in the "
            "sampler's order, before the skip decision. Set one of them to False.",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def check_dataset(dataset) -> None:
    """prompt_skipping draws replacement prompts by index: a map-style dataset with a `prompt` column."""
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise ValueError(
            f"prompt_skipping draws replacement prompts by index, which a {type(dataset).__name__} does not allow: "
            "use a map-style dataset (datasets.Dataset) or set prompt_skipping=False."
        )
    from replayrl.data.vision import has_images

    if has_images(dataset):
        raise ValueError(
            "prompt_skipping with an image dataset is not supported: prompts are identified by their text, which "
            "can be the same for different images. Set prompt_skipping=False."
        )


# --------------------------------------------------------------------------------------------- the trainer's side
def build_prompt_history(args, train_dataset) -> PromptHistory | None:
    """The trainer's history when `args.prompt_skipping`, after checking the dataset (None otherwise)."""
    if not getattr(args, "prompt_skipping", False):
        return None
    if train_dataset is not None:
        check_dataset(train_dataset)
    return PromptHistory(args.prompt_skipping_explore, args.prompt_skipping_target_zero_std)


def skip_prompts(trainer, inputs: list[dict]) -> list[dict]:
    """The rows to generate instead of the dataloader's `inputs` (each prompt repeated G times in a row): skipped
    prompts replaced (`select_prompts`). Deterministic in (seed, optimizer step, process)."""
    args, G = trainer.args, trainer.num_generations
    step, rank = trainer.state.global_step, trainer.accelerator.process_index
    generator = torch.Generator().manual_seed(((args.seed * 1_000_003 + step) * 131 + rank) * 7 + 5)
    drawn = inputs[::G]
    pool = dataset_pool(trainer.train_dataset, generator, list(inputs[0]))
    selection = select_prompts(drawn, trainer.prompt_history, pool, generator)
    trainer._prompt_selection = (drawn, selection)
    return [row for row in selection.rows for _ in range(G)]


def record_groups(trainer, rewards: torch.Tensor) -> None:
    """After scoring the generated groups (rewards: (B,), this process's rows in `skip_prompts`' order): every
    process's groups enter the history in rank order, `p` adapts to the global zero-std share, and the
    `prompt_skipping/*` metrics are logged. `drawn_reward` estimates the reward of the sampler's own draw (what plain
    GRPO would have generated): a generated prompt counts its fresh group's mean, a skipped one its last known mean
    (pessimistic while the policy improves on prompts it failed). `weighted_reward` is the other estimate: the fresh
    groups' means weighted by 1 / the probability their test let them through (self-normalised)."""
    from accelerate.utils import gather_object

    G, history, accelerator = trainer.num_generations, trainer.prompt_history, trainer.accelerator
    drawn, selection = trainer._prompt_selection
    trainer._prompt_selection = None
    zero = algos.zero_std_groups(rewards, G, getattr(trainer.args, "replay_zero_std_atol", 1e-6)).tolist()
    means = rewards.view(-1, G).nan_to_num(0.0).mean(1).tolist()
    local = [(prompt_key(row), bool(z), float(m)) for row, z, m in zip(selection.rows, zero, means)]
    fresh = {key: m for key, _, m in local}
    drawn_keys = [prompt_key(row) for row in drawn]  # generated: its fresh mean; skipped: its last known one
    drawn_means = [
        fresh[k] if g else history.last_mean.get(k, 0.0) for k, g in zip(drawn_keys, selection.generated_drawn)
    ]
    records = [item for items in gather_object([local]) for item in items]
    for key, is_zero, mean in records:
        history.record(key, is_zero, mean)
    frac_zero = sum(z for _, z, _ in records) / max(len(records), 1)
    history.adapt(frac_zero)
    weighted = [(m / q, 1.0 / q) for m, q in zip(means, selection.keep_probs)]
    counts = [len(drawn) - sum(selection.generated_drawn), selection.replacements, selection.filled]
    counts += [sum(drawn_means), len(drawn), sum(w for w, _ in weighted), sum(w for _, w in weighted)]
    totals = accelerator.reduce(torch.tensor([float(c) for c in counts], device=rewards.device), reduction="sum")
    skipped, replacements, filled, drawn_sum, drawn_n, weighted_sum, weights = totals.tolist()
    metrics = trainer._metrics["train"]
    metrics["prompt_skipping/skipped"].append(skipped)
    metrics["prompt_skipping/replacements"].append(replacements)
    metrics["prompt_skipping/filled"].append(filled)
    metrics["prompt_skipping/frac_zero_std"].append(frac_zero)
    metrics["prompt_skipping/explore"].append(history.explore)
    metrics["prompt_skipping/drawn_reward"].append(drawn_sum / max(drawn_n, 1.0))
    metrics["prompt_skipping/weighted_reward"].append(weighted_sum / max(weights, 1e-12))
