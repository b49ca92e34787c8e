"""What a model's attention accepts, for layouts that pass their own 4D mask (prefix sharing, packing).

transformers uses a 4D mask as given (sdpa: bool, True = may attend; eager: added to the scores) and builds
none of its own, so such a mask also overrides a sliding window. FlashAttention reads no mask at all.
"""

from __future__ import annotations

import torch
from torch import Tensor


def is_peft_model(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def base_model(model):
    """The transformers model under DDP and PEFT wrappers."""
    while hasattr(model, "module"):  # DDP
        model = model.module
    return model.get_base_model() if is_peft_model(model) else model


def mask_kind(model) -> str | None:
    """How the model takes a 4D attention mask: 'bool' (sdpa), 'additive' (eager), None (FlashAttention and
    others read no such mask)."""
    impl = getattr(base_model(model).config, "_attn_implementation", None) or "sdpa"
    return {"sdpa": "bool", "eager": "additive"}.get(impl)


def attention_mask_for(model, allowed: Tensor) -> Tensor:
    """A (N, 1, L, L) bool "query may see key" mask in the form the model's attention takes."""
    if mask_kind(model) == "bool":
        return allowed
    dtype = base_model(model).dtype  # eager adds the mask to the scores
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def sliding_window(config) -> int | None:
    """The model's sliding attention window if any layer uses one (a 4D mask would override it), else None."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if any("sliding" in t for t in layer_types) else None
    return window if getattr(config, "use_sliding_window", True) else None
