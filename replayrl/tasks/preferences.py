"""Preference pairs on the built-in addition prompts, for the DPO and reward default jobs, tests and examples.

Two kinds of pair, both on prompts "7+5=" with chosen = the sum "12":

- `rejected="malformed"` (the default jobs): rejected = the same sum, badly formed: a stray character before
  it ("x12", "#12"), after it ("12?", "12k"), or the answer repeated ("12 12"). The preference follows a rule
  that holds for every prompt ("answer with the number and nothing else"), so a tiny model that learns it
  scores unseen prompts right: held-out accuracy measures generalisation, and >= 0.95 is reachable in seconds.
- `rejected="near_miss"`: rejected = a wrong sum (sum +-1, +-2). Judging it means adding, which a tiny model
  trained on 80 operand pairs does not generalise to unseen ones (measured: 0.72 held-out for the reward job,
  0.60 for DPO); it memorises the training prompts' answers, which is what the pipeline example needs from a
  reward model that scores the prompts it was trained on.

The same HELD_OUT operand pairs as the GRPO job are kept out of training in both kinds. Deterministic under
`seed`.
"""

from __future__ import annotations

import random

from datasets import Dataset

from replayrl.tasks.addition import HELD_OUT, NEAR_MISSES, problems

TASK_DESCRIPTION = (
    "addition prompts a+b=, chosen = the sum, rejected = the sum badly formed (a stray character before or "
    "after it, or repeated); held-out prompts unseen"
)
REJECTED_KINDS = ("malformed", "near_miss")
STRAY = "xyzqk?!#@&"  # characters a malformed answer carries (none of the prompt syntax "0-9+=")


def malformed(answer: str, rng: random.Random) -> str:
    """`answer` badly formed: a stray character before or after it, or the answer repeated after a space."""
    kind = rng.randrange(3)
    if kind == 0:
        return rng.choice(STRAY) + answer
    if kind == 1:
        return answer + rng.choice(STRAY)
    return f"{answer} {answer}"


def _rejected(a: int, b: int, per_problem: int, kind: str, rng: random.Random) -> list[str]:
    if kind == "near_miss":
        wrong = [str(a + b + d) for d in NEAR_MISSES if a + b + d >= 0]
        return rng.sample(wrong, min(per_problem, len(wrong)))
    return [malformed(str(a + b), rng) for _ in range(per_problem)]


def _pairs(operands: list[tuple[int, int]], per_problem: int, kind: str, rng: random.Random, prompt_column: bool):
    rows: dict[str, list] = {"prompt": [], "chosen": [], "rejected": []}
    for a, b in operands:
        for wrong in _rejected(a, b, per_problem, kind, rng):
            rows["prompt"].append(f"{a}+{b}=")
            rows["chosen"].append(str(a + b))
            rows["rejected"].append(wrong)
    if not prompt_column:  # implicit-prompt form: whole texts
        rows["chosen"] = [p + c for p, c in zip(rows["prompt"], rows["chosen"])]
        rows["rejected"] = [p + r for p, r in zip(rows["prompt"], rows["rejected"])]
        del rows["prompt"]
    return Dataset.from_dict(rows)


def preference_datasets(
    seed: int = 0, per_problem: int = 2, prompt_column: bool = True, rejected: str = "malformed"
) -> tuple[Dataset, Dataset]:
    """(train, held_out) preference datasets: `per_problem` pairs per operand pair; the HELD_OUT operand pairs
    (chosen by `seed`) only in held_out. `rejected`: "malformed" or "near_miss" (module docstring). With
    `prompt_column=False` chosen/rejected are whole texts (implicit prompt)."""
    if rejected not in REJECTED_KINDS:
        raise ValueError(f"rejected={rejected!r} is not a kind of pair; use one of {REJECTED_KINDS}")
    operands = problems()
    rng = random.Random(seed)
    rng.shuffle(operands)
    train = _pairs(operands[HELD_OUT:], per_problem, rejected, rng, prompt_column)
    return train.shuffle(seed=seed), _pairs(operands[:HELD_OUT], per_problem, rejected, rng, prompt_column)
