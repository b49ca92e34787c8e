"""ExGRPO-style mixing (arXiv:2510.02245): a stored success of a prompt joins a fresh group of the same prompt.

The buffer of the GRPOWithReplayBuffer pull request (trl.experimental) swaps a zero-std group for a whole group of
*another* prompt. On a sparse task most zero-std groups are all-failed, and a prompt that failed now may have
succeeded before: putting one stored success of that prompt into its fresh all-failed group turns the group
informative (advantages recomputed with it), so the failing prompt itself gets a signal, anchored by G-1 fresh
on-policy rows. Plain torch; no trainer imports.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor

from replayrl import algos
from replayrl.grpo.rollout import Rollout

STORE_PROMPTS = 4096  # prompts whose latest success is kept (least recently stored evicted first)


def prompt_key(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[int, ...]:
    """Identity of a prompt: its real (unpadded) token ids. prompt_ids, prompt_mask: (P,)."""
    return tuple(prompt_ids[prompt_mask.bool()].tolist())


@dataclass
class StoredSuccess:
    row: Rollout  # one row, trimmed, on CPU, with behaviour log-probs
    version: int  # optimizer step at which it was generated
    reuse: int = 0


class SuccessStore:
    """Per prompt, the freshest successful completion (a row with positive advantage in its group).

    At most `capacity` prompts (least recently stored evicted first); entries older than `max_age` optimizer
    steps or used `max_reuse` times are dropped when looked up. Same operations on every process give the same
    store (no randomness)."""

    def __init__(self, capacity: int, max_age: int | None = None, max_reuse: int | None = None):
        self.capacity, self.max_age, self.max_reuse = capacity, max_age, max_reuse
        self.entries: OrderedDict[tuple[int, ...], StoredSuccess] = OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, key: tuple[int, ...], row: Rollout, version: int) -> None:
        self.entries.pop(key, None)
        self.entries[key] = StoredSuccess(row.trim().to("cpu").clone(), int(version))
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)

    def peek(self, key: tuple[int, ...], current_version: int) -> StoredSuccess | None:
        """The prompt's stored success if still fresh enough (a stale one is dropped), else None."""
        entry = self.entries.get(key)
        if entry is not None and self.max_age is not None and current_version - entry.version > self.max_age:
            del self.entries[key]
            return None
        return entry

    def take(self, key: tuple[int, ...], current_version: int) -> StoredSuccess | None:
        """`peek`, counting a use: the entry leaves the store once used `max_reuse` times."""
        entry = self.peek(key, current_version)
        if entry is None:
            return None
        entry.reuse += 1
        if self.max_reuse is not None and entry.reuse >= self.max_reuse:
            del self.entries[key]
        return entry

    def state_dict(self) -> dict:
        return {
            "capacity": self.capacity,
            "max_age": self.max_age,
            "max_reuse": self.max_reuse,
            "entries": [
                {"key": list(k), "row": e.row.state_dict(), "version": e.version, "reuse": e.reuse}
                for k, e in self.entries.items()
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        self.capacity, self.max_age, self.max_reuse = state["capacity"], state["max_age"], state["max_reuse"]
        self.entries = OrderedDict(
            (tuple(e["key"]), StoredSuccess(Rollout.from_state_dict(e["row"]), e["version"], e["reuse"]))
            for e in state["entries"]
        )


def mix_into_group(group: Rollout, stored: Rollout, scale_rewards: str, pad_token_id: int) -> Rollout:
    """The group (G rows) with its last row replaced by `stored` (1 row, flagged replayed) and the group's
    advantages recomputed over the new rewards (`scale_rewards` as in GRPO; 'batch' scales by this group's std).
    """
    G = group.num_rows
    fresh = group.rows(slice(0, G - 1))
    stored = stored.to(group.prompt_ids.device).with_(replayed=torch.ones_like(stored.replayed))
    mixed = Rollout.concat([fresh, stored], pad_token_id=pad_token_id)
    scale = "group" if scale_rewards == "batch" else scale_rewards
    advantages = algos.group_advantages(mixed.rewards, G, scale).to(mixed.advantages.dtype)
    return mixed.with_(advantages=advantages)


def successes_of_group(group: Rollout) -> int | None:
    """Index of the row to store for this fresh group: its best-rewarded row when the group has a positive
    advantage somewhere (i.e. reward variance), else None."""
    if not bool((group.advantages > 0).any()):
        return None
    return int(torch.argmax(torch.nan_to_num(group.rewards, nan=float("-inf"))))
