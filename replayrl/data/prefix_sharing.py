"""Prefix sharing for preference pairs (Wang & Hegde, arXiv:2410.20305): a pair's common start is encoded once.

The usual layout scores a pair as two rows, chosen and rejected, each starting with the same prompt, so every
prompt token runs through a causal model twice. Here a pair is ONE row, `prefix | chosen rest | rejected rest`,
where `prefix` is the longest common start of the two sequences (the prompt, and any completion tokens the two
share), with

  - position ids `0..p-1 | p..p+c-1 | p..p+r-1`: each rest sits at the positions it has in its own sequence;
  - an attention mask in which the rejected rest sees the prefix and itself, never the chosen rest;

so every token sees exactly the context, at the positions, it has in the two-row layout: log-probs and scores
are the same up to float rounding, from p + c + r tokens instead of 2p + c + r (and less padding). Rows are as
wide as the batch's widest pair; shorter pairs share a row where they fit (first-fit decreasing), the mask
keeping each pair to itself. `SharedPrefixRows.positions` maps an index into a pair's own chosen or rejected
sequence to its position in the shared row: that is how a caller finds the logits predicting a token, or the
last token a reward model reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from replayrl.models.attention import base_model, mask_kind, sliding_window
from replayrl.models.prompt_learning import prompt_learning_config

PREFIX, CHOSEN, REJECTED, PADDING = 0, 1, 2, 3
SIDES = ("chosen", "rejected")


@dataclass
class SharedPrefixRows:
    """B pairs in R <= B rows of width L. Pair b lives in row `row_of_pair[b]` from column `offsets[b]`; its
    common prefix has `prefix_lengths[b]` tokens, its own sequences `lengths[side][b]`."""

    input_ids: Tensor  # (R, L)
    position_ids: Tensor  # (R, L)
    segments: Tensor  # (R, L): PREFIX, CHOSEN, REJECTED or PADDING
    pair_ids: Tensor  # (R, L): the pair a column belongs to, -1 for padding
    row_of_pair: Tensor  # (B,)
    offsets: Tensor  # (B,)
    prefix_lengths: Tensor  # (B,)
    lengths: dict[str, Tensor]  # side -> (B,)

    def positions(self, side: str, index: Tensor) -> Tensor:
        """Column in pair b's row of token `index[b, ...]` of its own `side` sequence. index (B, ...) -> same."""
        expand = (-1,) + (1,) * (index.dim() - 1)
        offsets, prefix = self.offsets.view(expand), self.prefix_lengths.view(expand)
        if side == "chosen":
            return offsets + index
        chosen_rest = (self.lengths["chosen"] - self.prefix_lengths).view(expand)
        return offsets + index + torch.where(index >= prefix, chosen_rest, 0)

    def attention_allowed(self) -> Tensor:
        """(R, 1, L, L) bool, query x key: causal, within one pair, and a key outside the prefix only for queries
        of its own segment. Padding sees earlier padding and itself, so no row of the mask is empty."""
        seg, pair = self.segments, self.pair_ids
        width = seg.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=seg.device).tril()
        same_pair = pair[:, None, :] == pair[:, :, None]
        visible = (seg[:, None, :] == PREFIX) | (seg[:, None, :] == seg[:, :, None])
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


def _common_prefix(a: Tensor, b: Tensor) -> int:
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if len(differ) else n


def share_prefixes(
    chosen: Tensor,
    chosen_mask: Tensor,
    rejected: Tensor,
    rejected_mask: Tensor,
    pad_token_id: int,
    pad_to_multiple_of: int | None = None,
):
    """Right-padded chosen (B, Lc) and rejected (B, Lr) ids with their attention masks -> `SharedPrefixRows`, the
    row width rounded up to a multiple of `pad_to_multiple_of` when given (padding columns, attending to
    themselves only)."""
    pairs = []
    for i in range(chosen.shape[0]):
        a, b = chosen[i, : int(chosen_mask[i].sum())], rejected[i, : int(rejected_mask[i].sum())]
        pairs.append((a, b, _common_prefix(a, b)))
    return _layout(pairs, pad_token_id, pad_to_multiple_of)


def share_prefixes_for(
    model,
    chosen: Tensor,
    chosen_mask: Tensor,
    rejected: Tensor,
    rejected_mask: Tensor,
    pad_token_id: int,
    pad_to_multiple_of: int | None = None,
) -> SharedPrefixRows | None:
    """`share_prefixes`, or None where `model` cannot be given the layout: its attention reads no 4D mask
    (FlashAttention, flex), a mask is not right-padded, a sliding window is narrower than the rows, or a
    prompt-learning PEFT adapter prepends its virtual tokens to a 2-D mask (`replayrl.models.prompt_learning`)."""
    right_padded = all(
        torch.equal(m.bool(), torch.arange(m.shape[1], device=m.device) < m.sum(1, keepdim=True))
        for m in (chosen_mask, rejected_mask)
    )
    if mask_kind(model) is None or not right_padded or prompt_learning_config(model) is not None:
        return None
    rows = share_prefixes(chosen, chosen_mask, rejected, rejected_mask, pad_token_id, pad_to_multiple_of)
    window = sliding_window(base_model(model).config)
    return None if window is not None and rows.input_ids.shape[1] > window else rows


def _layout(
    pairs: list[tuple[Tensor, Tensor, int]], pad_token_id: int, multiple: int | None = None
) -> SharedPrefixRows:
    sizes = [len(a) + len(b) - p for a, b, p in pairs]
    place = first_fit(sizes, max(sizes))
    width = max(offset + size for (_, offset), size in zip(place, sizes))
    if multiple:
        width = -(-width // multiple) * multiple
    num_rows, device = 1 + max(row for row, _ in place), pairs[0][0].device
    ids = torch.full((num_rows, width), pad_token_id, dtype=torch.long)
    positions = torch.zeros(num_rows, width, dtype=torch.long)
    segments = torch.full((num_rows, width), PADDING, dtype=torch.long)
    pair_ids = torch.full((num_rows, width), -1, dtype=torch.long)
    for i, ((a, b, p), (row, o)) in enumerate(zip(pairs, place)):
        c, r = len(a) - p, len(b) - p
        ids[row, o : o + p + c + r] = torch.cat([a, b[p:]]).cpu()
        positions[row, o : o + p + c + r] = torch.cat([torch.arange(p + c), torch.arange(p, p + r)])
        segments[row, o : o + p], segments[row, o + p : o + p + c] = PREFIX, CHOSEN
        segments[row, o + p + c : o + p + c + r] = REJECTED
        pair_ids[row, o : o + p + c + r] = i
    as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
    return SharedPrefixRows(
        input_ids=ids.to(device),
        position_ids=positions.to(device),
        segments=segments.to(device),
        pair_ids=pair_ids.to(device),
        row_of_pair=as_tensor([row for row, _ in place]),
        offsets=as_tensor([offset for _, offset in place]),
        prefix_lengths=as_tensor([p for _, _, p in pairs]),
        lengths={
            "chosen": as_tensor([len(a) for a, _, _ in pairs]),
            "rejected": as_tensor([len(b) for _, b, _ in pairs]),
        },
    )


def completion_targets(rows: SharedPrefixRows, side: str, ids: Tensor, starts: Tensor) -> tuple[Tensor, ...]:
    """The tokens `ids[b, starts[b]:lengths[b]]` of each pair's `side` sequence (B, L_side) as targets (B, T),
    the row columns whose logits predict them (B, T) (the previous token's column), and their mask (B, T)
    (padding, and a first token with nothing before it, are False; their targets and sources are 0)."""
    lengths = rows.lengths[side]
    span = int((lengths - starts).max().clamp(min=0))
    index = starts[:, None] + torch.arange(span, device=ids.device)  # (B, T) indices into the own sequence
    mask = (index < lengths[:, None]) & (index >= 1)
    targets = ids.gather(1, index.clamp(max=ids.shape[1] - 1))
    sources = torch.where(mask, rows.positions(side, (index - 1).clamp(min=0)), 0)  # in range where masked
    return torch.where(mask, targets, 0), sources, mask
