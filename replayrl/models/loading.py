"""The one loading path of every trainer: models and tokenizers by name, local path or object, and dropout off.

Every role goes through `load_model`: the policy (SFT, DPO, reward, GRPO, PPO), a reference given by name (DPO),
a reward model given by name (GRPO/PPO reward functions), the value model (PPO's value head wraps a policy
loaded here), and later a teacher. The rule, as TRL 1.16's `create_model_from_path`:

- a name or path loads in **float32** unless the init kwargs name a `dtype` (`"bfloat16"`, `"float16"`,
  `"float32"`, a `torch.dtype`, or `"auto"` for the checkpoint's own dtype). transformers 5's `from_pretrained`
  alone would load the checkpoint's dtype (bf16 for most published models) and the optimizer would then update
  bf16 weights directly, rounding small updates away; mixed precision comes from `bf16=True` / `fp16=True`
  (autocast over the float32 weights), as in TRL;
- a model object passes through untouched: it keeps the dtype it has.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
)

logger = logging.getLogger(__name__)
DTYPE_NAMES = ("bfloat16", "float16", "float32")
ARCHITECTURES = {
    "causal_lm": AutoModelForCausalLM,
    "seq2seq_lm": AutoModelForSeq2SeqLM,
    "reward": AutoModelForSequenceClassification,
}


def model_id(model: str | PreTrainedModel) -> str:
    """The name or path a model was given by (a model object: the one it was loaded from, "" if none)."""
    if isinstance(model, str):
        return model
    config = getattr(model, "config", None)
    return str(getattr(config, "_name_or_path", "") or "")


def resolve_init_kwargs(init_kwargs: dict[str, Any] | None, name: str = "model_init_kwargs") -> dict[str, Any]:
    """A copy of `init_kwargs` with its dtype settled: float32 when unset, a dtype name turned into the
    `torch.dtype`, "auto" (the checkpoint's dtype) and a `torch.dtype` as given. The older key `torch_dtype` is
    read as `dtype`. Anything else is a ValueError naming the value."""
    kwargs = dict(init_kwargs or {})
    if "torch_dtype" in kwargs:
        if "dtype" in kwargs:
            raise ValueError(f"{name} sets both dtype and torch_dtype; keep only dtype.")
        kwargs["dtype"] = kwargs.pop("torch_dtype")
    dtype = kwargs.get("dtype", "float32")
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        dtype = getattr(torch, dtype)
    elif not (isinstance(dtype, torch.dtype) or dtype == "auto"):
        raise ValueError(
            f"{name}['dtype'] = {dtype!r} is not a dtype: use one of {list(DTYPE_NAMES)}, 'auto' (the checkpoint's "
            "own dtype) or a torch.dtype; leave it out for float32."
        )
    kwargs["dtype"] = dtype
    return kwargs


def load_model(
    model: str | PreTrainedModel,
    init_kwargs: dict[str, Any] | None = None,
    *,
    architecture: Literal["causal_lm", "seq2seq_lm", "reward"] = "causal_lm",
    role: str = "model",
    kwargs_name: str = "model_init_kwargs",
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """A model object passes through (with init kwargs: a ValueError, they could not apply); a name or local path
    is loaded with `from_pretrained` of the `architecture` ("reward": a sequence classifier with one label;
    "seq2seq_lm": an encoder-decoder LM), in
    float32 unless `init_kwargs` name a dtype (`resolve_init_kwargs`), with `trust_remote_code` added when set (the
    config flag of TRL 1.16's GRPO/KTO/distillation configs). `role` and `kwargs_name` only word the errors
    ("reward model", "ref_model_init_kwargs")."""
    if not isinstance(model, str):
        if init_kwargs:
            raise ValueError(
                f"{kwargs_name} only apply when `{role}` is a name or path, not a model object: drop them, or pass "
                "the name or path."
            )
        return model
    kwargs = resolve_init_kwargs(init_kwargs, kwargs_name)
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
    if architecture == "reward":
        kwargs["num_labels"] = 1
    try:
        cls = ARCHITECTURES[architecture]
        if architecture == "causal_lm" and is_vision_language(model, trust_remote_code=trust_remote_code):
            from transformers import AutoModelForImageTextToText as cls  # as TRL 1.16: a VLM's own class
        return cls.from_pretrained(model, **kwargs)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"Could not load {role} {model!r} ({err}). Pass a local directory written by `save_pretrained` (or a "
            "Hub name) or a model object."
        ) from err


def is_vision_language(model: str | PreTrainedModel, **remote: Any) -> bool:
    """Whether a model (object, or name/path: its config is read) is an image-text-to-text model (a VLM). A config
    that cannot be read says no: loading the model itself then reports why."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    try:
        config = model.config if not isinstance(model, str) else AutoConfig.from_pretrained(model, **remote)
    except (OSError, ValueError):
        return False
    return getattr(config, "model_type", None) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def check_vision_model(model: str | PreTrainedModel, **remote: Any) -> None:
    """TRL 1.16's refusal, in its words, of a dataset with images for a model that is not a vision-language one."""
    if not is_vision_language(model, **remote):
        raise ValueError(
            "The dataset appears to be vision-related (contains 'image' or 'images' keys), but the provided model "
            f"({model_id(model) or type(model).__name__}) does not seem to be a vision-language model. Please check "
            "your model and dataset: pass an image-text-to-text model, or a dataset without images."
        )


def load_tokenizer(
    processing_class,
    model: str | PreTrainedModel,
    *,
    pad_with_eos: bool = True,
    **tokenizer_kwargs: Any,
):
    """`processing_class` if given, else the tokenizer saved with the model (`AutoTokenizer`, with
    `tokenizer_kwargs` such as `padding_side` or `trust_remote_code`); with `pad_with_eos`, a tokenizer without a
    pad token pads with its EOS token."""
    if processing_class is None:
        name = model_id(model)
        if not name:
            raise ValueError(
                "the model object does not say where it was loaded from, so its tokenizer cannot be found: pass "
                "processing_class=<its tokenizer>."
            )
        try:
            load = AutoTokenizer.from_pretrained
            remote = {k: v for k, v in tokenizer_kwargs.items() if k == "trust_remote_code"}
            if is_vision_language(model, **remote):  # as TRL 1.16: a VLM's processor (images + text)
                from replayrl.models.processors import load_processor as load
            processing_class = load(name, **tokenizer_kwargs)
        except (OSError, ValueError) as err:
            raise ValueError(
                f"Could not load the tokenizer of {name!r} ({err}). Pass processing_class=<its tokenizer>, or a "
                "directory written by `save_pretrained` that holds one."
            ) from err
    if pad_with_eos and getattr(processing_class, "pad_token", "") is None:
        processing_class.pad_token = processing_class.eos_token
    return processing_class


def set_special_token(tokenizer, name: str, token: str) -> None:
    """`tokenizer.<name> = token` (name: "pad_token", "eos_token"), as TRL 1.16's configs set them; a token that is
    not in the vocabulary (or no tokenizer) is a ValueError naming it, not a new token the model has no row for."""
    if tokenizer is None or token not in tokenizer.get_vocab():
        raise ValueError(
            f"{name}={token!r} is not in the tokenizer's vocabulary (or no tokenizer was given); pass one of its "
            f"tokens, or leave {name} unset."
        )
    setattr(tokenizer, name, token)


def mirror_eos_token(model: PreTrainedModel, tokenizer, eos_token: str) -> None:
    """TRL 1.16's SFT ``eos_token``: the tokenizer's EOS becomes ``eos_token`` (one of its tokens), and the model
    agrees from construction on: its (text) config's ``eos_token_id`` is the new id, and its generation config
    stops on it too, first among the EOS ids it already had (any of which ends generation)."""
    set_special_token(tokenizer, "eos_token", eos_token)
    new_id = tokenizer.eos_token_id
    model.config.get_text_config().eos_token_id = new_id
    generation = getattr(model, "generation_config", None)
    if generation is None:
        return
    old = generation.eos_token_id
    old = [] if old is None else [old] if isinstance(old, int) else list(old)
    if new_id not in old:
        generation.eos_token_id = [new_id, *old]


def apply_peft(model: PreTrainedModel, peft_config, added_tokens: list[int] | None = None) -> PreTrainedModel:
    """`model` wrapped by `peft.get_peft_model(model, peft_config)`; unchanged when `peft_config` is None.

    `added_tokens` (ids a cloned chat template added, `replayrl.data.chat_template`) get trainable rows, as in
    TRL 1.16: they join `peft_config.trainable_token_indices["embed_tokens"]`, and a model with an untied output
    layer gets `lm_head` in `modules_to_save` so it can learn to emit them. TRL adds it to tied models too, where
    PEFT 0.21 fails in the forward (its trainable tokens already update the tied head), and to sequence
    classifiers, which have none."""
    if peft_config is None:
        return model
    try:
        from peft import get_peft_model
    except ImportError as err:
        raise ImportError("peft_config needs peft: pip install replayrl[peft]") from err
    if added_tokens:
        _train_added_tokens(model, peft_config, added_tokens)
    return get_peft_model(model, peft_config)


def _train_added_tokens(model: PreTrainedModel, peft_config, added_tokens: list[int]) -> None:
    indices = peft_config.trainable_token_indices
    if indices is None:
        peft_config.trainable_token_indices = {"embed_tokens": list(added_tokens)}
    elif isinstance(indices, list):  # PEFT's shorthand for the input embedding
        indices.extend(added_tokens)
    else:
        indices.setdefault("embed_tokens", []).extend(added_tokens)
    head = model.get_output_embeddings()
    if head is None or head.weight is model.get_input_embeddings().weight:
        return  # no output layer (a sequence classifier), or tied: PEFT's trainable tokens cover the tied head
    if "lm_head" in (peft_config.modules_to_save or []):
        return
    logger.warning(
        "The cloned chat template added tokens but 'lm_head' is not in the PEFT config's modules_to_save; adding "
        "it so the model can learn to generate them (set modules_to_save=['lm_head'] to silence this)."
    )
    peft_config.modules_to_save = [*(peft_config.modules_to_save or []), "lm_head"]


def disable_dropout(model: nn.Module) -> None:
    """Dropout off for good, whatever train()/eval() later says: every `nn.Dropout` to p=0, and the config's
    `attention_dropout` (applied functionally inside attention, not by a module) to 0."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "attention_dropout", None):
        config.attention_dropout = 0.0
