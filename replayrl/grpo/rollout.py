"""`Rollout`: the one record that carries a batch of scored completions from generation to the loss.

Rows are samples (one prompt + one completion); consecutive runs of G rows form a group. Prompts are
left-padded, completions right-padded; every per-token field knows its padding side, so that slicing,
trimming and re-padding are written once, here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

from replayrl.data.vision import VisionInputs

_LEFT = {"pad": "left"}  # prompt-side per-token field
_RIGHT = {"pad": "right"}  # completion-side per-token field
_ROW = {"pad": None}  # one value per row
_VISION = {"pad": "vision"}  # VisionInputs: rows index their prompt's stored images


@dataclass
class Rollout:
    """A batch of N rows. Shapes: P = prompt width, C = completion width.

    `old_logps` are the behaviour log-probs: the log-probs under the policy that generated the row
    (NaN where not computed yet: on-policy rows take the current log-probs at their first loss pass,
    which are then exactly the behaviour log-probs). `policy_version` is the optimizer step at which the
    row was generated; `replayed` marks rows that came out of the replay buffer. `engine_logps` are the log-probs a
    generation engine (vLLM) reported for the tokens it sampled (None with transformers `generate`). `vision`: the
    model's image inputs, stored once per prompt (`VisionInputs`; None for text-only rows).
    """

    prompt_ids: Tensor = field(metadata=_LEFT)  # (N, P) long
    prompt_mask: Tensor = field(metadata=_LEFT)  # (N, P) long
    completion_ids: Tensor = field(metadata=_RIGHT)  # (N, C) long
    completion_mask: Tensor = field(metadata=_RIGHT)  # (N, C) long, 1 = real token (up to and including EOS)
    rewards: Tensor = field(metadata=_ROW)  # (N,) float, weighted sum over reward functions (NaN = unscored)
    advantages: Tensor = field(metadata=_ROW)  # (N,) float
    policy_version: Tensor = field(metadata=_ROW)  # (N,) long
    replayed: Tensor = field(metadata=_ROW)  # (N,) bool
    truncated: Tensor = field(metadata=_ROW)  # (N,) bool, no EOS within max_completion_length
    old_logps: Tensor | None = field(default=None, metadata=_RIGHT)  # (N, C) float
    ref_logps: Tensor | None = field(default=None, metadata=_RIGHT)  # (N, C) float
    loss_weights: Tensor | None = field(default=None, metadata=_RIGHT)  # (N, C) float, see algos.token_weights
    engine_logps: Tensor | None = field(default=None, metadata=_RIGHT)  # (N, C) float, vLLM's sampled-token log-probs
    tool_mask: Tensor | None = field(default=None, metadata=_RIGHT)  # (N, C) long, 0 = tool-result token (no loss)
    vision: VisionInputs | None = field(default=None, metadata=_VISION)  # images of the prompts (data/vision.py)

    @property
    def num_rows(self) -> int:
        return self.prompt_ids.shape[0]

    def _map(self, fn) -> Rollout:
        """Apply `fn(tensor, pad_side)` to every tensor field; None fields stay None."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = None if value is None else fn(value, f.metadata["pad"])
        return Rollout(**out)

    def rows(self, index: slice | Tensor) -> Rollout:
        """Rows selected by a slice or an index tensor (views for slices)."""
        return self._map(lambda t, _: t[index])

    def split(self, n: int) -> list[Rollout]:
        """`n` equal consecutive row chunks (micro-batches)."""
        assert self.num_rows % n == 0, (self.num_rows, n)
        size = self.num_rows // n
        return [self.rows(slice(i * size, (i + 1) * size)) for i in range(n)]

    def to(self, device: torch.device | str) -> Rollout:
        return self._map(lambda t, _: t.to(device))

    def clone(self) -> Rollout:
        """Own storage (no views that pin a larger batch in memory)."""
        return self._map(lambda t, _: t.clone())

    def trim(self) -> Rollout:
        """Drop prompt columns that are padding in every row (left) and completion columns past every
        row's last real token (right)."""
        p_keep = self.prompt_mask.any(0).nonzero()
        p_start = int(p_keep[0]) if len(p_keep) else self.prompt_mask.shape[1]
        c_idx = self.completion_mask.any(0).nonzero()
        c_end = int(c_idx[-1]) + 1 if len(c_idx) else 0

        def cut(t: Tensor, side: str | None) -> Tensor:
            if side == "left":
                return t[:, p_start:]
            if side == "right":
                return t[:, :c_end]
            return t

        return self._map(cut)

    def with_(self, **changes) -> Rollout:
        return replace(self, **changes)

    def model_inputs(self, completion_width: int | None = None) -> dict[str, Tensor]:
        """The model's extra (vision) inputs for a forward over prompt + ``completion_width`` completion positions
        (default: the completion width); empty for text-only rows."""
        if self.vision is None:
            return {}
        width = self.completion_ids.shape[1] if completion_width is None else completion_width
        return self.vision.model_kwargs(self.prompt_mask, width)

    def state_dict(self) -> dict:
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.vision is not None:
            state["vision"] = self.vision.state_dict()
        return state

    @classmethod
    def from_state_dict(cls, state: dict) -> Rollout:
        state = dict(state)
        if state.get("vision") is not None:
            state["vision"] = VisionInputs.from_state_dict(state["vision"])
        return cls(**state)

    @classmethod
    def concat(cls, parts: list[Rollout], pad_token_id: int = 0) -> Rollout:
        """Stack rollouts row-wise, re-padding every per-token field on its own side. Optional fields
        missing in some parts are filled with NaN (log-probs) in those rows."""
        assert parts, "concat needs at least one rollout"
        out = {}
        for f in fields(cls):
            values = [getattr(p, f.name) for p in parts]
            if all(v is None for v in values):
                out[f.name] = None
                continue
            side = f.metadata["pad"]
            if side == "vision":
                if any(v is None for v in values):
                    raise ValueError("cannot concatenate rows with images and rows without (text-only) in one batch")
                out[f.name] = VisionInputs.concat(values)
                continue
            if side is None:
                out[f.name] = torch.cat(values)
                continue
            fill = pad_token_id if f.name.endswith("_ids") else (float("nan") if f.name.endswith("logps") else 0)
            fill = 1 if f.name == "tool_mask" else fill  # rows without tool calls: every token is the model's
            width = max(_width(p, side) for p in parts)
            padded = [_pad_to(v, p, side, width, fill) for v, p in zip(values, parts)]
            out[f.name] = torch.cat(padded)
        return cls(**out)


def _width(r: Rollout, side: str) -> int:
    return r.prompt_ids.shape[1] if side == "left" else r.completion_ids.shape[1]


def _pad_to(value: Tensor | None, part: Rollout, side: str, width: int, fill) -> Tensor:
    """Pad `value` (N, w) to (N, width) on `side`; a missing optional field becomes all-`fill`."""
    n, w = part.num_rows, _width(part, side)
    if value is None:
        dtype = torch.float32 if isinstance(fill, float) else torch.long
        value = torch.full((n, w), fill, dtype=dtype, device=part.prompt_ids.device)
    if w == width:
        return value
    pad = torch.full((n, width - w), fill, dtype=value.dtype, device=value.device)
    return torch.cat([pad, value] if side == "left" else [value, pad], dim=1)


def fit_width(values: Tensor | None, width: int) -> Tensor | None:
    """(N, C') -> (N, width): cut, or right-pad with zeros (padding positions are masked wherever used)."""
    if values is None or values.shape[1] == width:
        return values
    if values.shape[1] > width:
        return values[:, :width]
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def known_or(values: Tensor | None, current: Tensor, real: Tensor) -> Tensor:
    """`values` (N, C) where known and on a real token, else `current`. Padding positions (NaN, or values that
    are not log-probs) must never reach exp(): NaN * 0 is NaN, in the loss and in its gradient."""
    if values is None:
        return current
    return torch.where(real & ~values.isnan(), values, current)
