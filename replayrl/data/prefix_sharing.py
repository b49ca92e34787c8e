"""Prefix sharing for preference pairs (Wang & Hegde, arXiv:2410.20305): a pair's prompt is encoded once.

The usual layout scores a pair as two rows, prompt + chosen and prompt + rejected, so every prompt token runs
through the model twice. Here a pair is ONE row, `prompt | chosen | rejected | padding`, with

  - position ids `0..p-1 | p..p+c-1 | p..p+r-1`: the rejected completion sits at the positions it has in its
    own row;
  - an attention mask in which the rejected tokens see the prompt and the earlier rejected tokens but not the
    chosen ones (every other token sees what causal attention gives it);

so each completion token sees exactly the context, and the positions, it has in the two-row layout: the
log-probs are the same up to float rounding, from about p + c + r tokens instead of 2p + c + r (and less
padding). The first rejected token is predicted by the logits at the prompt's last position, so the layout also
says, for each completion token, which position's logits predict it (`sources`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

PROMPT, CHOSEN, REJECTED, PADDING = 0, 1, 2, 3


@dataclass
class SharedPrefixRows:
    """B pairs in R <= B rows of width L (the widest pair): a pair shorter than the row's free space shares a row
    with others, each seeing only itself. Pair b lives in row `row_of_pair[b]`; `sources[side]` (B, T_side): the
    position in that row whose logits predict the side's t-th completion token `targets[side]` (B, T_side);
    `target_mask[side]` marks the real ones (padding, and a first token with no position before it, are 0)."""

    input_ids: Tensor  # (R, L)
    position_ids: Tensor  # (R, L)
    segments: Tensor  # (R, L): PROMPT, CHOSEN, REJECTED or PADDING
    pair_ids: Tensor  # (R, L): the pair a position belongs to, -1 for padding
    row_of_pair: Tensor  # (B,)
    sources: dict[str, Tensor]
    targets: dict[str, Tensor]
    target_mask: dict[str, Tensor]

    def attention_allowed(self) -> Tensor:
        """(R, 1, L, L) bool, query x key: causal, within one pair, and a key outside the prompt only for queries
        of its own segment. Padding sees earlier padding and itself, so no row of the mask is empty."""
        seg, pair = self.segments, self.pair_ids
        width = seg.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=seg.device).tril()
        same_pair = pair[:, None, :] == pair[:, :, None]
        visible = (seg[:, None, :] == PROMPT) | (seg[:, None, :] == seg[:, :, None])
        return (same_pair & visible & causal)[:, None]


def first_fit(lengths: list[int], width: int) -> list[tuple[int, int]]:
    """(row, offset) per item: first-fit decreasing packing of `lengths` into rows of `width` (ties keep order)."""
    used: list[int] = []
    place = [(0, 0)] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, u in enumerate(used) if u + lengths[i] <= width), len(used))
        if row == len(used):
            used.append(0)
        place[i] = (row, used[row])
        used[row] += lengths[i]
    return place


def _prompt_length(labels: Tensor, row_length: int, label_pad_token_id: int) -> int:
    """Tokens before the first completion label (the whole row when no completion token survived truncation)."""
    completion = (labels[:row_length] != label_pad_token_id).nonzero()
    return int(completion[0]) if len(completion) else row_length


def share_prefixes(batch: dict[str, Tensor], label_pad_token_id: int, pad_token_id: int) -> SharedPrefixRows | None:
    """The seed's batch (`chosen_input_ids`, `chosen_attention_mask`, `chosen_labels`, the same for `rejected_*`,
    right-padded, labels = `label_pad_token_id` on prompt and padding) -> one row per pair. None when a pair's
    two rows do not start with the same prompt (truncation cut them differently): use two rows then."""
    pieces = []
    for i in range(batch["chosen_input_ids"].shape[0]):
        parts = {}
        for side in ("chosen", "rejected"):
            length = int(batch[f"{side}_attention_mask"][i].sum())
            ids = batch[f"{side}_input_ids"][i, :length]
            p = _prompt_length(batch[f"{side}_labels"][i], length, label_pad_token_id)
            parts[side] = (ids[:p], ids[p:])
        (prompt, chosen), (other_prompt, rejected) = parts["chosen"], parts["rejected"]
        if not torch.equal(prompt, other_prompt):
            return None
        pieces.append((prompt, chosen, rejected))
    return _layout(pieces, pad_token_id)


def _layout(pieces: list[tuple[Tensor, Tensor, Tensor]], pad_token_id: int) -> SharedPrefixRows:
    lengths = [len(p) + len(c) + len(r) for p, c, r in pieces]
    n = len(pieces)
    place = first_fit(lengths, max(lengths))
    width = max(offset + length for (_, offset), length in zip(place, lengths))
    num_rows, device = 1 + max(row for row, _ in place), pieces[0][0].device
    ids = torch.full((num_rows, width), pad_token_id, dtype=torch.long)
    positions = torch.zeros(num_rows, width, dtype=torch.long)
    segments = torch.full((num_rows, width), PADDING, dtype=torch.long)
    pair_ids = torch.full((num_rows, width), -1, dtype=torch.long)
    t_max = {"chosen": max(len(c) for _, c, _ in pieces), "rejected": max(len(r) for _, _, r in pieces)}
    sources = {s: torch.zeros(n, t, dtype=torch.long) for s, t in t_max.items()}
    targets = {s: torch.zeros(n, t, dtype=torch.long) for s, t in t_max.items()}
    mask = {s: torch.zeros(n, t, dtype=torch.bool) for s, t in t_max.items()}
    for i, ((prompt, chosen, rejected), (row, o)) in enumerate(zip(pieces, place)):
        p, c, r = len(prompt), len(chosen), len(rejected)
        ids[row, o : o + p + c + r] = torch.cat([prompt, chosen, rejected]).cpu()
        positions[row, o : o + p + c + r] = torch.cat([torch.arange(p + c), torch.arange(p, p + r)])
        segments[row, o : o + p], segments[row, o + p : o + p + c] = PROMPT, CHOSEN
        segments[row, o + p + c : o + p + c + r] = REJECTED
        pair_ids[row, o : o + p + c + r] = i
        # token t of a completion starting at `start` is predicted by position start + t - 1; the first rejected
        # token by the prompt's last position (p - 1), like in its own row
        src_chosen = torch.arange(p - 1, p + c - 1)
        src_rejected = torch.cat([torch.tensor([p - 1]), torch.arange(p + c, p + c + r - 1)])[:r]
        for side, src, tokens in (("chosen", src_chosen, chosen), ("rejected", src_rejected, rejected)):
            k = len(tokens)
            sources[side][i, :k] = o + src.clamp(min=0)
            targets[side][i, :k] = tokens.cpu()
            mask[side][i, :k] = src >= 0
    row_of_pair = torch.tensor([row for row, _ in place])
    to = lambda d: {k: v.to(device) for k, v in d.items()}  # noqa: E731
    return SharedPrefixRows(
        ids.to(device), positions.to(device), segments.to(device), pair_ids.to(device), row_of_pair.to(device),
        to(sources), to(targets), to(mask),
    )  # fmt: skip
