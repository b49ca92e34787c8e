"""Built-in offline environment for `GRPOTrainer(environment_factory=CounterEnv)` (TRL's environment contract):
the model reaches a target count by calling the environment's `increment` tool; the environment owns the reward.

- `reset(target=None, **example)`: zeroes the counter and returns the task text (appended to the prompt's last
  user message). The target is the example's `target` column; without one, the environment owns the data: the
  n-th reset of every instance draws the same target from a seeded sequence, so the rollouts of one batch (one
  reset of each pooled instance) share a task.
- `increment(step)`: the tool; adds `step` to the counter and returns the new count.
- `get_reward()`: 1.0 at the target, falling linearly to 0.0 at twice the target's distance (deterministic).

Pair it with `replayrl.tasks.calculator.build_tool_tokenizer()` (a chat template that renders tools and tool
calls) for a fully offline run: examples/grpo_environment.py.
"""

from __future__ import annotations

import random

from datasets import Dataset

LOW, HIGH = 1, 9  # target range


class CounterEnv:
    """A counter to drive to a target with `increment` calls."""

    def __init__(self, seed: int = 0):
        self._rng = random.Random(seed)
        self.count = 0
        self.target = 0
        self.calls = 0

    def reset(self, target: int | None = None, **example) -> str:
        self.count, self.calls = 0, 0
        self.target = int(target) if target is not None else self._rng.randint(LOW, HIGH)
        return f" Reach {self.target} with the increment tool."

    def increment(self, step: int) -> int:
        """Add a step to the counter.

        Args:
            step: How much to add to the counter.

        Returns:
            The counter after the addition.
        """
        self.calls += 1
        self.count += int(step)
        return self.count

    def get_reward(self) -> float:
        return max(0.0, 1.0 - abs(self.target - self.count) / max(abs(self.target), 1))


def counter_dataset(n: int, seed: int = 0) -> Dataset:
    """`n` chat prompts with a `target` column in [LOW, HIGH] (passed to `reset`)."""
    rng = random.Random(seed)
    targets = [rng.randint(LOW, HIGH) for _ in range(n)]
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": "Count."}]] * n, "target": targets})
