"""TRL's `ReplayBuffer` interface (trl.experimental.grpo_with_replay_buffer) on top of replayrl's buffer.

TRL's class: ``ReplayBuffer(max_size)``; ``add(scores, data)`` keeps the ``max_size`` highest-scoring items
(a min-heap: a newcomer replaces the current minimum only if it scores higher); ``sample(num_samples)`` draws
items with probability proportional to their score, with replacement only when more are asked than held, and
returns None when empty; ``heap`` is the list of ``(score, data)`` pairs, the minimum first.

`ScoredHeap` is that store; `replayrl.ReplayBuffer` holds one and routes TRL-style calls to it, so code written
against TRL's class runs unchanged. Differences: ties never compare the data (TRL's heap of ``(score, dict)``
raises TypeError on equal scores); sampling uses the buffer's seeded generator.
"""

from __future__ import annotations

import heapq
from typing import Any

import torch


class ScoredHeap:
    """The ``max_size`` highest-scoring items. Entries are ``(score, insertion counter, data)``; the counter breaks
    ties (the older item is evicted first) so the data are never compared."""

    def __init__(self, max_size: int):
        self.max_size = max_size
        self._entries: list[tuple[float, int, Any]] = []
        self._counter = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def heap(self) -> list[tuple[float, Any]]:
        """``(score, data)`` pairs in heap order (``heap[0]`` has the lowest score), as TRL's ``heap``."""
        return [(score, data) for score, _, data in self._entries]

    def add(self, scores: list[float], data: list) -> None:
        if len(scores) != len(data):
            raise ValueError(f"add(scores, data): {len(scores)} scores for {len(data)} items; give one score each.")
        for score, datum in zip(scores, data):
            entry = (float(score), self._counter, datum)
            self._counter += 1
            if len(self._entries) < self.max_size:
                heapq.heappush(self._entries, entry)
            elif self._entries and entry[0] > self._entries[0][0]:
                heapq.heapreplace(self._entries, entry)

    def sample(self, num_samples: int, generator: torch.Generator | None = None) -> list | None:
        """``num_samples`` items drawn in proportion to score; None when empty (TRL's contract)."""
        if not self._entries:
            return None
        weights = torch.tensor([e[0] for e in self._entries], dtype=torch.float64).clamp(min=0)
        if weights.sum() <= 0:  # all-zero scores: uniform rather than a multinomial error
            weights = torch.ones_like(weights)
        replacement = num_samples > len(self._entries)
        picked = torch.multinomial(weights, num_samples, replacement=replacement, generator=generator).tolist()
        return [self._entries[i][2] for i in picked]

    def state_dict(self) -> dict:
        return {"max_size": self.max_size, "counter": self._counter, "entries": list(self._entries)}

    def load_state_dict(self, state: dict) -> None:
        self.max_size, self._counter = state["max_size"], state["counter"]
        self._entries = [tuple(e) for e in state["entries"]]
        heapq.heapify(self._entries)


def is_trl_add(args: tuple, kwargs: dict) -> bool:
    """``add(scores, data)`` (TRL) rather than ``add(rollout, score, version)`` (replayrl)."""
    if "scores" in kwargs or "data" in kwargs:
        return True
    return len(args) == 2 and isinstance(args[0], (list, tuple)) and isinstance(args[1], (list, tuple))
