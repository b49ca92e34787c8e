"""`ReplayBuffer`: a bounded store of informative prompt groups, sampled in proportion to their score.

No transformers/accelerate imports: the buffer is plain Python + torch, so it is unit-testable and its
state is a dict of tensors and numbers. Groups are stored trimmed and on CPU (see `Rollout.trim`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from replayrl.algos import group_std
from replayrl.grpo.rollout import Rollout
from replayrl.replay.trl_compat import ScoredHeap, is_trl_add

ReplayScore = Literal["adv_std", "variance", "uniform"]
RolloutPriority = Literal["abs_advantage", "positive_advantage"]


def group_score(rewards: Tensor, advantages: Tensor, kind: ReplayScore) -> float:
    """Priority of one group. rewards, advantages: (G,).

    - "adv_std": sum_i |A_i| * std(r), TRL's score (grows with spread and with group size);
    - "variance": var(r), for 0/1 rewards p(1-p) * G/(G-1): highest when the success rate is 1/2;
    - "uniform": 1 for every group.
    """
    std = float(group_std(rewards, rewards.numel()))
    if kind == "adv_std":
        return float(advantages.abs().sum()) * std
    if kind == "variance":
        return std**2
    if kind == "uniform":
        return 1.0
    raise ValueError(f"replay score must be one of 'adv_std', 'variance', 'uniform' (got {kind!r}).")


def rollout_priority(advantages: Tensor, kind: RolloutPriority) -> Tensor:
    """Priority of each stored rollout (row) for `replay_unit="rollout"`. advantages: (N,), each row's advantage
    within the group it was generated in.

    - "abs_advantage": |A_i| (arXiv 2606.04560's advantage-prioritized rollouts): with 0/1 rewards a group's rare
      successes carry most of it, its failures the rest;
    - "positive_advantage": max(A_i, 0): only rollouts that did better than their group are replayed.
    """
    if kind == "abs_advantage":
        return advantages.abs()
    if kind == "positive_advantage":
        return advantages.clamp(min=0)
    raise ValueError(f"replay rollout priority must be 'abs_advantage' or 'positive_advantage' (got {kind!r}).")


@dataclass
class ReplayGroup:
    rollout: Rollout  # G rows, trimmed, on CPU, with behaviour log-probs
    score: float
    version: int  # optimizer step at which the group was generated
    uid: int  # insertion counter: unique, and the tie-break between equal scores (older goes first)
    reuse: int = 0  # how often the group has been replayed


class ReplayBuffer:
    """Keeps the `capacity` highest-scoring groups.

    Also TRL's interface (see `replay/trl_compat.py`): ``ReplayBuffer(max_size=...)``, ``add(scores, data)``,
    ``sample(num_samples)`` (None when empty) and ``heap``; TRL-style items live in their own store.

    `add` evicts the lowest score when full (ties: the oldest), and drops a newcomer that scores below
    everything kept. `sample(k)` draws up to k distinct groups with probability proportional to score and
    returns fewer when the buffer holds fewer (the caller logs the shortfall). `max_age` (optimizer steps)
    and `max_reuse` bound staleness. Sampling uses the buffer's own seeded generator, so every process that
    applies the same operations holds the same buffer and draws the same groups.
    """

    def __init__(
        self,
        capacity: int | None = None,
        seed: int = 0,
        max_age: int | None = None,
        max_reuse: int | None = None,
        *,
        max_size: int | None = None,
    ):
        if (capacity is None) == (max_size is None):
            raise ValueError("Give the buffer size once: ReplayBuffer(capacity) or ReplayBuffer(max_size=...) (TRL).")
        capacity = capacity if capacity is not None else max_size
        if capacity < 0:
            raise ValueError(f"replay_buffer_size must be >= 0 (got {capacity}).")
        self.max_size = capacity  # TRL's name
        self.scored = ScoredHeap(capacity)  # TRL-style (score, data) items
        self._trl_style = max_size is not None
        self.capacity = capacity
        self.max_age = max_age
        self.max_reuse = max_reuse
        self.groups: list[ReplayGroup] = []
        self.generator = torch.Generator().manual_seed(seed)
        self._next_uid = 0

    def __len__(self) -> int:
        return len(self.groups) + len(self.scored)

    @property
    def trl_style(self) -> bool:
        """Whether the buffer holds TRL-style ``(score, dict)`` items (built with ``max_size=``, or given a TRL
        ``add(scores, data)``)."""
        return self._trl_style

    @property
    def heap(self) -> list[tuple[float, object]]:
        """TRL's view: ``(score, data)`` pairs, lowest score first (groups appear as `ReplayGroup` data)."""
        if self._trl_style:
            return self.scored.heap
        return sorted(((g.score, g) for g in self.groups), key=lambda pair: (pair[0], pair[1].uid))

    def add(self, *args, **kwargs):
        """``add(rollout, score, version) -> bool`` stores a group; ``add(scores, data)`` is TRL's call."""
        if is_trl_add(args, kwargs):
            self._trl_style = True
            return self.scored.add(*args, **kwargs)
        return self._add_group(*args, **kwargs)

    def _add_group(self, rollout: Rollout, score: float, version: int) -> bool:
        """Store a group (detached copy on CPU). Returns whether it was kept."""
        if self.capacity == 0:
            return False
        group = ReplayGroup(rollout.trim().to("cpu").clone(), float(score), int(version), self._next_uid)
        self._next_uid += 1
        if len(self.groups) >= self.capacity:
            worst = min(range(len(self.groups)), key=lambda i: (self.groups[i].score, self.groups[i].uid))
            if self.groups[worst].score >= group.score:
                return False
            self.groups.pop(worst)
        self.groups.append(group)
        return True

    def evict_stale(self, current_version: int) -> int:
        """Drop groups older than `max_age` optimizer steps. Returns how many were dropped."""
        if self.max_age is None:
            return 0
        before = len(self.groups)
        self.groups = [g for g in self.groups if current_version - g.version <= self.max_age]
        return before - len(self.groups)

    def sample(self, num_samples: int) -> list[ReplayGroup]:
        """Up to `num_samples` (TRL's argument name) distinct groups, drawn with probability proportional to
        score; each drawn group's reuse count goes up and it leaves the buffer once it reaches `max_reuse`.
        A TRL-style buffer follows TRL: ``num_samples`` items, with replacement only when more are asked than
        held, None when empty."""
        if self._trl_style:
            return self.scored.sample(num_samples, self.generator)
        k = min(num_samples, len(self.groups))
        if k == 0:
            return []
        weights = torch.tensor([g.score for g in self.groups], dtype=torch.float64).clamp(min=0)
        if weights.sum() <= 0:  # all-zero scores: uniform instead of a multinomial error
            weights = torch.ones_like(weights)
        picked = torch.multinomial(weights, k, replacement=False, generator=self.generator).tolist()
        chosen = [self.groups[i] for i in picked]
        for g in chosen:
            g.reuse += 1
        if self.max_reuse is not None:
            self.groups = [g for g in self.groups if g.reuse < self.max_reuse]
        return chosen

    def sample_rollouts(self, num_samples: int, priority: RolloutPriority) -> list[tuple[ReplayGroup, int]]:
        """Up to `num_samples` distinct rollouts (group, row index) drawn across every buffered group with
        probability proportional to `rollout_priority` (none of priority 0). A group whose rollouts were drawn
        counts one reuse per call (`max_reuse`)."""
        if self._trl_style:
            raise ValueError("replay_unit='rollout' needs replayrl's own buffer, not a TRL-style one.")
        weights = self._rollout_weights(priority)
        k = min(num_samples, int((weights > 0).sum()))
        if k == 0:
            return []
        rows = [(g, i) for g in self.groups for i in range(g.rollout.num_rows)]
        picked = torch.multinomial(weights.double(), k, replacement=False, generator=self.generator).tolist()
        chosen = [rows[j] for j in picked]
        for g in {g.uid: g for g, _ in chosen}.values():
            g.reuse += 1
        if self.max_reuse is not None:
            self.groups = [g for g in self.groups if g.reuse < self.max_reuse]
        return chosen

    def num_rollouts(self, priority: RolloutPriority) -> int:
        """How many stored rollouts `sample_rollouts` could draw (priority above 0)."""
        return 0 if self._trl_style else int((self._rollout_weights(priority) > 0).sum())

    def _rollout_weights(self, priority: RolloutPriority) -> Tensor:
        """(rows of every buffered group, in order,) `rollout_priority` of each."""
        if not self.groups:
            return torch.zeros(0)
        return rollout_priority(torch.cat([g.rollout.advantages.float() for g in self.groups]), priority)

    def reconfigure(self, capacity: int, max_age: int | None, max_reuse: int | None) -> None:
        """Take new limits (on resume with other settings): over capacity, the highest-scored groups stay."""
        self.capacity, self.max_age, self.max_reuse = capacity, max_age, max_reuse
        if len(self.groups) > capacity:
            self.groups = sorted(self.groups, key=lambda g: g.score, reverse=True)[:capacity]

    def state_dict(self) -> dict:
        return {
            "capacity": self.capacity,
            "max_age": self.max_age,
            "max_reuse": self.max_reuse,
            "next_uid": self._next_uid,
            "trl_style": self._trl_style,
            "scored": self.scored.state_dict(),
            "generator": self.generator.get_state(),
            "groups": [
                {
                    "rollout": g.rollout.state_dict(),
                    "score": g.score,
                    "version": g.version,
                    "uid": g.uid,
                    "reuse": g.reuse,
                }
                for g in self.groups
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        self.capacity, self.max_age, self.max_reuse = state["capacity"], state["max_age"], state["max_reuse"]
        self._next_uid = state["next_uid"]
        self._trl_style = state.get("trl_style", False)
        if "scored" in state:
            self.scored.load_state_dict(state["scored"])
        self.generator.set_state(state["generator"])
        self.groups = [
            ReplayGroup(Rollout.from_state_dict(g["rollout"]), g["score"], g["version"], g["uid"], g["reuse"])
            for g in state["groups"]
        ]
