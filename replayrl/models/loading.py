"""Loading models by name, local path or object."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel


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
