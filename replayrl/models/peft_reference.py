"""The reference of a model passed already wrapped as a `PeftModel`, as TRL 1.16 builds it.

A `peft_config` given to a trainer makes a fresh adapter, whose base model is exactly the starting policy: the
reference is the policy with its adapters disabled. A `PeftModel` passed as is may carry a pretrained adapter (SFT
with LoRA, then DPO/GRPO), whose base model is not the starting policy. TRL 1.16's DPO, GRPO, RLOO and KTO then add
a frozen `"ref"` adapter, a copy of the trained one, and compute the reference with it active: the reference is the
policy as given. `add_reference_adapter` builds that copy at init; `reference_adapter` is the context of a
reference pass. The copy is rebuilt identically from the passed model on resume (like the frozen full copy made
for a plain model), so it needs no checkpoint state of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from replayrl.models.attention import is_peft_model

logger = logging.getLogger(__name__)

REF_ADAPTER = "ref"  # TRL 1.16's name


def _skip_for_target_parameters(config) -> bool:
    """TRL 1.16's exception: PEFT 0.17-0.19 cannot hold a second LoRA adapter next to one with `target_parameters`
    (peft#3340), so the reference there is the base model."""
    import peft
    from packaging.version import Version
    from peft import LoraConfig

    in_range = Version("0.17.0") <= Version(peft.__version__) < Version("0.20.0")
    return isinstance(config, LoraConfig) and in_range and bool(getattr(config, "target_parameters", None))


@torch.no_grad()
def add_reference_adapter(model) -> None:
    """Adds the frozen `"ref"` adapter, a copy of `model`'s active adapter, to a `PeftModel` passed already wrapped.

    Call it only when the trainer got no `peft_config` and no `ref_model`. Plain models pass through. TRL 1.16
    copies the adapter named `"default"` (a `KeyError` otherwise); this copies the active one, whatever its name.
    """
    if not is_peft_model(model):
        return
    active = model.active_adapter
    if not isinstance(active, str):
        raise ValueError(
            f"The PeftModel has several active adapters ({active}); its reference would be ambiguous. Activate "
            "the one to train with model.set_adapter(name), or pass a ref_model."
        )
    if REF_ADAPTER in model.peft_config:
        raise ValueError(
            f"The PeftModel already has an adapter named {REF_ADAPTER!r}, the name the trainer gives the frozen copy "
            f"of the trained adapter {active!r} that plays the reference. Rename or delete it "
            f"(model.delete_adapter({REF_ADAPTER!r})), or pass a ref_model."
        )
    config = model.peft_config[active]
    if _skip_for_target_parameters(config):
        logger.warning(
            "PEFT<0.20.0 can't add a frozen reference adapter alongside one that uses `target_parameters` "
            "(peft#3340), so the reference log-probs are computed from the base model (adapters disabled). Upgrade "
            "to peft>=0.20.0 to train against a copy of your adapter instead."
        )
        return
    requires_grad = {id(p): p.requires_grad for p in model.parameters()}
    model.add_adapter(REF_ADAPTER, config)
    params = dict(model.named_parameters())
    for name, param in params.items():
        if f".{active}." in name:
            params[name.replace(f".{active}.", f".{REF_ADAPTER}.")].copy_(param)
    for param in model.parameters():  # the trained adapter as it was; the copy (new parameters) frozen
        param.requires_grad_(requires_grad.get(id(param), False))


@contextmanager
def reference_adapter(model) -> Iterator:
    """Inside: `model` (a `PeftModel`) computes the reference: its `"ref"` adapter active if it has one, else
    its adapters disabled. After: the trained adapter active again and every parameter's `requires_grad` as before
    (PEFT's `set_adapter` marks the adapter it activates trainable and the others frozen; its `disable_adapter`
    marks the whole active adapter trainable on exit, even parameters the user froze)."""
    requires_grad = [(p, p.requires_grad) for p in model.parameters()]
    try:
        if REF_ADAPTER not in model.peft_config:
            with model.disable_adapter():
                yield model
            return
        previous = model.active_adapter
        model.set_adapter(REF_ADAPTER)
        try:
            yield model
        finally:
            model.set_adapter(previous)
    finally:
        for param, flag in requires_grad:
            param.requires_grad_(flag)


def reload_trained_adapter(model, checkpoint) -> None:
    """After `Trainer._load_from_checkpoint`: the trained adapter of a `PeftModel` that carries the `"ref"` copy,
    loaded again from the checkpoint's top level.

    A checkpoint of such a model holds the trained adapter at its top level and the copy under `ref/`.
    transformers 5.2 (the declared floor) loads only the sub-folders when there are any, so the trained adapter
    would silently stay as rebuilt from the passed model; 5.24 loads the top level too (this repeats it, harmless).
    """
    while hasattr(model, "module"):  # DDP
        model = model.module
    if not is_peft_model(model) or REF_ADAPTER not in model.peft_config:
        return
    root = [f for f in ("adapter_model.safetensors", "adapter_model.bin") if (Path(checkpoint) / f).exists()]
    if not root:
        return
    active = model.active_adapter
    requires_grad = [(p, p.requires_grad) for p in model.parameters()]
    model.load_adapter(str(checkpoint), active, is_trainable=True)
    model.set_adapter(active)
    for param, flag in requires_grad:
        param.requires_grad_(flag)
