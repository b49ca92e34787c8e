"""Loading the policy, and TR-DPO's reference-model sync."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, TrainerCallback


def load_causal_lm(model: str | PreTrainedModel, init_kwargs: dict | None) -> PreTrainedModel:
    """A model object passes through; a name or local path is loaded with `from_pretrained`."""
    if not isinstance(model, str):
        if init_kwargs:
            raise ValueError("model_init_kwargs only apply when `model` is a name or path, not a model object.")
        return model
    kwargs = dict(init_kwargs or {})
    dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    if isinstance(dtype, str) and dtype != "auto":
        kwargs["dtype" if "dtype" in kwargs else "torch_dtype"] = getattr(torch, dtype)
    try:
        return AutoModelForCausalLM.from_pretrained(model, **kwargs)
    except OSError as err:
        raise ValueError(
            f"Could not load model {model!r}: it is not a local directory with a saved model and could not be "
            f"fetched from the Hub ({err}). Pass a path written by `save_pretrained` or a model object."
        ) from err


class SyncRefModelCallback(TrainerCallback):
    """TR-DPO (arXiv:2404.09656): every `ref_model_sync_steps`, ref <- alpha * policy + (1 - alpha) * ref."""

    def __init__(self, trainer):
        self.trainer = trainer

    @torch.no_grad()
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.ref_model_sync_steps != 0:
            return
        unwrap = self.trainer.accelerator.unwrap_model
        alpha = args.ref_model_mixup_alpha
        for ref, pol in zip(unwrap(self.trainer.ref_model).parameters(), unwrap(self.trainer.model).parameters()):
            ref.mul_(1 - alpha).add_(pol.detach(), alpha=alpha)
