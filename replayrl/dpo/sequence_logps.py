"""Sequence log-probs of a DPO batch's chosen and rejected completions, in three layouts of the same tokens.

Each function runs ONE forward of `model` and returns per-sequence sums for the 2B sequences (chosen first):
`logps` (summed completion-token log-probs), `lengths` (completion tokens), and with `with_logits` the mean
completion logit (`logits`) and, with `with_wpo`, WPO's log-weight (`wpo`, arXiv:2406.11827), each (2B,).
With `ld_alpha` (LD-DPO, `replayrl.algos.preference.ld_token_weights`) `logps` is the weighted sum (tokens past
the pair's shared completion length count `ld_alpha` times) and `plain_logps` the unweighted one.

  - `padded_sums`: chosen and rejected rows concatenated, right-padded (2B, L): TRL's layout;
  - `shared_sums`: one prefix-shared row per pair (`replayrl.data.prefix_sharing`, arXiv:2410.20305);
  - `packed_sums`: every sequence packed into one row without padding (`padding_free`).
All three give the same sums up to float rounding (tests/dpo/test_trainer.py).
"""

from __future__ import annotations

import inspect
from collections import defaultdict

import torch
from torch import Tensor

from replayrl.algos.preference import ld_token_weights, shared_completion_lengths
from replayrl.data.prefix_sharing import SIDES, SharedPrefixRows, completion_targets
from replayrl.models.attention import attention_mask_for, base_model, mask_kind
from replayrl.models.lm_head import HeadInput, forward_to_head


def padded_sums(
    model,
    ids: Tensor,
    mask: Tensor,
    labels: Tensor,
    label_pad_token_id: int,
    with_logits: bool,
    with_wpo: bool,
    ld_alpha: float | None = None,
    **model_inputs,
) -> dict[str, Tensor]:
    """Rows (R, L) as they are; only the logits from the first completion position on are computed.
    `model_inputs`: a VLM's image inputs for the rows (`pixel_values`, ...)."""
    completion = labels != label_pad_token_id
    # logits at position t predict token t + 1: keep them from the first completion token - 1 on
    first = int(completion.float().argmax(1)[completion.any(1)].min()) if completion.any() else 1
    start = max(first - 1, 0)
    kwargs = {"logits_to_keep": ids.shape[1] - start} if _accepts_logits_to_keep(model) else {}
    _, head = forward_to_head(model, input_ids=ids, attention_mask=mask, use_cache=False, **kwargs, **model_inputs)
    head = head.positions(slice(-(ids.shape[1] - start), -1))
    targets, target_mask = labels[:, start + 1 :], completion[:, start + 1 :]
    return _token_sums(head, targets, target_mask, None, ids.shape[0], with_logits, with_wpo, ld_alpha)


def shared_sums(
    model,
    batch: dict,
    rows: SharedPrefixRows,
    label_pad_token_id: int,
    with_logits: bool,
    with_wpo: bool,
    ld_alpha: float | None = None,
) -> dict[str, Tensor]:
    """Prefix-shared rows (R, L) -> per-sequence sums for the 2B sequences (chosen first), as `padded_sums`.
    Logits are computed from the first predicting column on."""
    sides = {}
    for side in SIDES:
        completion = batch[f"{side}_labels"] != label_pad_token_id
        starts = torch.where(completion.any(1), completion.int().argmax(1), rows.lengths[side])
        sides[side] = completion_targets(rows, side, batch[f"{side}_input_ids"], starts)
    real = [sources[mask] for _, sources, mask in sides.values()]
    start = min((int(r.min()) for r in real if len(r)), default=0)
    width = rows.input_ids.shape[1]
    kwargs = {"logits_to_keep": width - start} if _accepts_logits_to_keep(model) else {}
    mask = attention_mask_for(model, rows.attention_allowed())
    _, head = forward_to_head(
        model, input_ids=rows.input_ids, attention_mask=mask, position_ids=rows.position_ids, use_cache=False, **kwargs
    )
    head = head.positions(slice(-(width - start), None))
    position_terms = _position_terms(head, with_logits, with_wpo)
    parts: dict[str, list[Tensor]] = defaultdict(list)
    if ld_alpha is not None:
        counts = torch.cat([mask_t.sum(1) for _, _, mask_t in sides.values()])
        shared = shared_completion_lengths(counts).chunk(2)
    for i, (targets, sources, mask_t) in enumerate(sides.values()):
        src = (sources - start).clamp(min=0)
        logps = head.logps_at(src, targets, rows.row_of_pair) * mask_t
        if ld_alpha is None:
            parts["logps"].append(logps.sum(1))
        else:
            positions = mask_t.long().cumsum(1) * mask_t
            parts["logps"].append((logps * ld_token_weights(positions, shared[i][:, None], ld_alpha)).sum(1))
            parts["plain_logps"].append(logps.sum(1))
        count = mask_t.sum(1)
        parts["lengths"].append(count)
        for key, per_position in position_terms.items():  # mean over the completion of a per-position term
            values = per_position[rows.row_of_pair[:, None], src] + (logps.detach() if key == "wpo" else 0)
            parts[key].append((values * mask_t).sum(1) / count.clamp(min=1))
    return {key: torch.cat(values) for key, values in parts.items()}


def packed_sums(
    model,
    ids: Tensor,
    mask: Tensor,
    labels: Tensor,
    label_pad_token_id: int,
    with_logits: bool,
    with_wpo: bool,
    ld_alpha: float | None = None,
) -> dict[str, Tensor]:
    """Padding-free: the R rows' real tokens packed into one row, kept apart by position ids restarting at 0
    and (except under FlashAttention, which reads the position ids) a block-diagonal causal mask: position
    ids alone do not isolate sequences under sdpa/eager (../shared/notes/trainer-family.md)."""
    keep = mask.bool()
    lengths = keep.sum(1)
    flat_ids, flat_labels = ids[keep], labels[keep].clone()
    seg = torch.repeat_interleave(torch.arange(len(lengths), device=ids.device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    flat_labels[starts] = label_pad_token_id  # never a target of the previous sequence's last token
    position_ids = (torch.arange(len(flat_ids), device=ids.device) - starts[seg]).unsqueeze(0)
    kwargs = {"position_ids": position_ids}
    if mask_kind(model) is not None:
        allowed = (seg[:, None] == seg[None, :]) & torch.ones(len(seg), len(seg), dtype=torch.bool).tril()
        kwargs["attention_mask"] = attention_mask_for(model, allowed.to(ids.device)[None, None])
    _, head = forward_to_head(model, input_ids=flat_ids.unsqueeze(0), use_cache=False, **kwargs)
    targets = flat_labels[1:].unsqueeze(0)
    target_mask = targets != label_pad_token_id
    return _token_sums(
        head.positions(slice(None, -1)), targets, target_mask, seg[1:], len(lengths), with_logits, with_wpo, ld_alpha
    )


def _position_terms(head: HeadInput, with_logits: bool, with_wpo: bool) -> dict[str, Tensor]:
    """Per-position metric terms (B, L), no grad: the mean logit, and WPO's -log sum_v p(v)^2."""
    if not with_logits:
        return {}
    terms = {"logits": head.mean_logits()}
    if with_wpo:
        terms["wpo"] = head.reduce(wpo_log_norm)
    return terms


def wpo_log_norm(logits: Tensor) -> Tensor:
    """WPO's per-position ``-log sum_v p(v)^2`` (arXiv:2406.11827, Eq. 3) of float32 logits ``(c, V)`` -> ``(c,)``."""
    return -torch.logsumexp(2 * torch.log_softmax(logits, -1), -1)


def _accepts_logits_to_keep(model) -> bool:
    return "logits_to_keep" in inspect.signature(base_model(model).forward).parameters


def _token_sums(
    head: HeadInput,
    targets: Tensor,
    target_mask: Tensor,
    segments: Tensor | None,
    num_rows: int,
    with_logits: bool,
    with_wpo: bool,
    ld_alpha: float | None = None,
) -> dict[str, Tensor]:
    """Per-sequence sums over completion tokens. `head` (R', T, H or V) aligned with targets/target_mask (R', T);
    `segments` (T,) maps the tokens of a packed row (R' = 1) to their sequence, None when R' == num_rows.
    Returns logps, lengths (and logits = mean logit, wpo = WPO log-weight; with ld_alpha, logps LD-weighted and
    plain_logps), each (num_rows,)."""

    def per_row(values: Tensor) -> Tensor:
        values = values * target_mask
        if segments is None:
            return values.sum(1)
        return torch.zeros(num_rows, dtype=values.dtype, device=values.device).index_add(0, segments, values[0])

    token_logps = head.token_stats(targets.clamp(min=0), mask=target_mask).logps
    out = {"logps": per_row(token_logps)}
    out["lengths"] = per_row(torch.ones_like(targets, dtype=out["logps"].dtype)).round().long()
    if ld_alpha is not None:
        weights = _ld_weights(target_mask, segments, out["lengths"], ld_alpha)
        out["plain_logps"], out["logps"] = out["logps"], per_row(token_logps * weights)
    if with_logits:
        with torch.no_grad():
            count = out["lengths"].clamp(min=1)
            out["logits"] = per_row(head.mean_logits(target_mask)) / count
            if with_wpo:
                wpo = token_logps.detach() + head.reduce(wpo_log_norm, target_mask)
                out["wpo"] = per_row(wpo) / count
    return out


def _ld_weights(target_mask: Tensor, segments: Tensor | None, lengths: Tensor, ld_alpha: float) -> Tensor:
    """LD-DPO token weights (R', T) for `_token_sums`' layouts: rows (segments None) or one packed row whose
    tokens belong to sequences `segments` (T,), in order. lengths (num_rows,): completion tokens per sequence."""
    mask = target_mask.long()
    shared = shared_completion_lengths(lengths)
    if segments is None:
        return ld_token_weights(mask.cumsum(1) * mask, shared[:, None], ld_alpha)
    before = lengths.cumsum(0) - lengths  # completion tokens of the sequences packed before each one
    positions = (mask[0].cumsum(0) - before[segments]) * mask[0]
    return ld_token_weights(positions[None], shared[segments][None], ld_alpha)
