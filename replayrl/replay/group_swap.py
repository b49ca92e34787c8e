"""TRL's batch-level replay step, as plain torch: which groups have variance, a group as a buffer item, and the
batch with some groups swapped for buffered ones of another length (TRL's `update_with_replay_buffer` math).

Layout (TRL's): G = num_generations consecutive rows form a group; prompts are left-padded, completions and
per-token log-probs right-padded. A buffered group is a dict of (G, own width) tensors trimmed to its real tokens.
No trainer imports: `replay/update.py` puts these behind TRL's method names on the trainer.
"""

from __future__ import annotations

import torch
from torch import Tensor

VISION_FIELDS = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "image_sizes")
LOGP_FIELDS = ("old_per_token_logps", "ref_per_token_logps")


def per_group_std(group_std_rewards: Tensor, num_generations: int) -> Tensor:
    """One reward std per group, (num_groups,), from the std tensor TRL's method receives.

    Accepted layouts: (B,) one value per row (what TRL's trainer passes); (num_groups, G) with each row constant
    (group g's std repeated); or, square, each column constant: what TRL's own tests build with
    ``std.expand_as(group_advantages)`` (group g's std in column g, which TRL reads with ``max(dim=0)``).
    """
    std = group_std_rewards.detach()
    if std.dim() == 1:
        std = std.view(-1, num_generations)
    if std.dim() != 2:
        raise ValueError(
            f"group_std_rewards must have shape (B,) or (num_groups, G) (got {tuple(group_std_rewards.shape)})."
        )
    if bool((std == std[:, :1]).all()):
        return std[:, 0]
    if std.shape[0] == std.shape[1] and bool((std == std[:1]).all()):
        return std[0]
    raise ValueError(
        "group_std_rewards must hold one std per group: each row of the (num_groups, G) tensor constant "
        f"(std.unsqueeze(1).expand(-1, G)); got {std.tolist()}."
    )


def trim_group(data: Tensor, mask: Tensor, side: str) -> Tensor:
    """Columns of `data` (G, W, ...) that hold a real token in some row of `mask` (G, W): a left-padded tensor
    keeps its last columns, a right-padded one its first."""
    real = mask.any(0).nonzero()
    if side == "left":
        start = int(real[0]) if len(real) else mask.shape[1]
        return data[:, start:]
    end = int(real[-1]) + 1 if len(real) else 0
    return data[:, :end]


def group_item(batch: dict, group: int, num_generations: int) -> dict:
    """Group `group` of `batch` (TRL's keys, (B, W) tensors) as a buffer item: its rows, trimmed to real tokens.
    `advantages` is kept as TRL stores it: the group's row of `batch["advantages"]` (num_groups, G)."""
    rows = slice(group * num_generations, (group + 1) * num_generations)
    p_mask, c_mask = batch["prompt_mask"][rows], batch["completion_mask"][rows]
    item = {
        "prompt_ids": trim_group(batch["prompt_ids"][rows], p_mask, "left"),
        "prompt_mask": trim_group(p_mask, p_mask, "left"),
        "completion_ids": trim_group(batch["completion_ids"][rows], c_mask, "right"),
        "completion_mask": trim_group(c_mask, c_mask, "right"),
        "advantages": batch["advantages"][group].tolist(),
    }
    for name in LOGP_FIELDS:
        if batch.get(name) is not None:
            item[name] = trim_group(batch[name][rows], c_mask, "right")
    for name in VISION_FIELDS:
        if batch.get(name) is not None:
            item[name] = batch[name][rows]
    return item


def _pad(t: Tensor, width: int, side: str, value) -> Tensor:
    """(N, w, ...) -> (N, width, ...) padded with `value` on `side` (no-op when w == width)."""
    extra = width - t.shape[1]
    if extra <= 0:
        return t
    fill = torch.full((t.shape[0], extra, *t.shape[2:]), value, dtype=t.dtype, device=t.device)
    return torch.cat([fill, t] if side == "left" else [t, fill], dim=1)


def swap_groups(batch: dict, groups: list[int], items: list[dict], num_generations: int, pad_token_id: int) -> dict:
    """`batch` with group ``groups[i]`` replaced by ``items[i]`` for every i; a new dict, inputs untouched.

    batch: TRL's keys; prompt_ids/prompt_mask (B, P), completion_ids/completion_mask and the log-prob fields
    (B, C), advantages (num_groups, G), vision fields (B, ...). Widths become the largest of the batch's and the
    items' (prompts padded on the left, completions on the right), so buffered groups longer or shorter than the
    current batch both fit. A log-prob field present on one side only is NaN (unknown) on the other.
    """
    P = max([batch["prompt_ids"].shape[1]] + [it["prompt_ids"].shape[1] for it in items])
    C = max([batch["completion_ids"].shape[1]] + [it["completion_ids"].shape[1] for it in items])
    spec = {"prompt_ids": (P, "left", pad_token_id), "prompt_mask": (P, "left", 0)}
    spec.update({"completion_ids": (C, "right", pad_token_id), "completion_mask": (C, "right", 0)})
    spec.update({name: (C, "right", float("nan")) for name in LOGP_FIELDS})
    out = {k: v for k, v in batch.items()}
    ref = batch["completion_ids"]
    for name in LOGP_FIELDS:  # a field only the items have: NaN rows for the batch
        if out.get(name) is None and any(name in it for it in items):
            out[name] = torch.full(ref.shape, float("nan"), device=ref.device)
    for name, (width, side, value) in spec.items():
        if out.get(name) is not None:
            out[name] = _pad(out[name], width, side, value).clone()
    out["advantages"] = batch["advantages"].clone()
    for group, item in zip(groups, items):
        rows = slice(group * num_generations, (group + 1) * num_generations)
        for name, (width, side, value) in spec.items():
            if out.get(name) is None:
                continue
            if name in item:
                out[name][rows] = _pad(item[name].to(out[name].device), width, side, value)
            else:  # log-probs the item lacks: unknown
                out[name][rows] = float("nan")
        out["advantages"][group] = torch.as_tensor(item["advantages"], dtype=out["advantages"].dtype).reshape(-1)
        for name in VISION_FIELDS:
            if out.get(name) is not None and name in item:
                out[name] = out[name].clone() if out[name] is batch[name] else out[name]
                out[name][rows] = item[name].to(out[name].device)
    return out
