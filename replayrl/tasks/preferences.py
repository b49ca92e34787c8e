"""Preference pairs from the built-in addition task, for the DPO and reward default jobs and tests.

A pair is (prompt "7+5=", chosen "12", rejected a near miss "11"/"13"/"10"/"14"). The same HELD_OUT operand pairs
as the GRPO job are kept out of training, so held-out accuracy asks whether the model learnt to prefer correct
sums rather than memorising the training answers. Deterministic under `seed`.
"""

from __future__ import annotations

import random

from datasets import Dataset

from replayrl.tasks.addition import HELD_OUT, NEAR_MISSES, problems

TASK_DESCRIPTION = "single-digit addition a+b=, chosen = the sum, rejected = a near miss (sum +-1, +-2)"


def _pairs(operands: list[tuple[int, int]], per_problem: int, rng: random.Random, prompt_column: bool) -> Dataset:
    rows: dict[str, list] = {"prompt": [], "chosen": [], "rejected": []}
    for a, b in operands:
        wrong = [a + b + d for d in NEAR_MISSES if a + b + d >= 0]
        for w in rng.sample(wrong, min(per_problem, len(wrong))):
            rows["prompt"].append(f"{a}+{b}=")
            rows["chosen"].append(str(a + b))
            rows["rejected"].append(str(w))
    if not prompt_column:  # implicit-prompt form: whole texts
        rows["chosen"] = [p + c for p, c in zip(rows["prompt"], rows["chosen"])]
        rows["rejected"] = [p + r for p, r in zip(rows["prompt"], rows["rejected"])]
        del rows["prompt"]
    return Dataset.from_dict(rows)


def preference_datasets(seed: int = 0, per_problem: int = 2, prompt_column: bool = True) -> tuple[Dataset, Dataset]:
    """(train, held_out) preference datasets: `per_problem` pairs per operand pair, held-out operands apart.
    With `prompt_column=False` chosen/rejected are whole texts (implicit prompt)."""
    operands = problems()
    rng = random.Random(seed)
    rng.shuffle(operands)
    train = _pairs(operands[HELD_OUT:], per_problem, rng, prompt_column)
    return train.shuffle(seed=seed), _pairs(operands[:HELD_OUT], per_problem, rng, prompt_column)
