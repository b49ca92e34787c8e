"""Prompt-learning PEFT adapters (prompt tuning, p-tuning, prefix tuning): what they change for a trainer.

A `peft` prompt-learning model changes the forward of the model it wraps:

- prompt tuning (`PromptTuningConfig`), p-tuning (`PromptEncoderConfig`) and multitask prompt tuning prepend
  `num_virtual_tokens` learned embeddings to the input embeddings, so the outputs (logits, the lm_head's input)
  have that many more positions, at the front; `position_ids` are dropped (with PEFT's warning). With `labels`,
  PEFT labels the virtual positions -100, so its loss also trains the last virtual position to predict the first
  real token;
- prefix tuning (`PrefixTuningConfig`) puts its virtual tokens in the KV cache: the length is unchanged.

All of them prepend ones to a 2-D attention mask, so none can take the 4-D masks of packed or prefix-shared rows.
`replayrl.models.lm_head.forward_to_head` drops the virtual positions (keeping, on request, the last one); a
trainer where the adapter cannot work soundly refuses it with `refuse_prompt_learning`.
"""

from __future__ import annotations

from replayrl.models.attention import is_peft_model

# Prompt-learning methods that keep the sequence length (their virtual tokens live in the KV cache).
_CACHE_PREFIX_TYPES = ("PREFIX_TUNING", "CARTRIDGE")


def prompt_learning_config(model):
    """The active PEFT config of `model` (under DDP and value-head wrappers) when it is prompt learning, else None."""
    while hasattr(model, "module"):  # DDP
        model = model.module
    if not is_peft_model(model) and hasattr(model, "pretrained_model"):  # value-head wrapper
        model = model.pretrained_model
    if not is_peft_model(model):
        return None
    config = model.active_peft_config
    return config if getattr(config, "is_prompt_learning", False) else None


def virtual_positions(model) -> int:
    """Positions the adapter prepends to the model's outputs: `num_virtual_tokens` for prompt tuning and p-tuning,
    0 for prefix tuning, other adapters and plain models."""
    config = prompt_learning_config(model)
    if config is None or config.peft_type in _CACHE_PREFIX_TYPES:
        return 0
    return int(config.num_virtual_tokens)


def refuse_prompt_learning(model, trainer: str, reason: str, fix: str = "") -> None:
    """ValueError naming the prompt-learning config when `model` has one; `reason` says why `trainer` cannot."""
    config = prompt_learning_config(model)
    if config is not None:
        fix = f"{fix}, or use" if fix else "Use"
        raise ValueError(
            f"{trainer} does not support prompt-learning PEFT ({type(config).__name__}): {reason}. {fix} a "
            "weight-based adapter such as peft.LoraConfig instead."
        )


def refuse_with_4d_layouts(model, trainer: str, **options: bool) -> None:
    """`refuse_prompt_learning` when one of `options` (e.g. packing=True, padding_free=True) is on: those layouts
    keep sequences apart with 4-D masks or position ids, which prompt-learning adapters cannot take."""
    on = [name for name, value in options.items() if value]
    if on:
        refuse_prompt_learning(
            model,
            f"{trainer} with {' and '.join(f'{name}=True' for name in on)}",
            "PEFT prepends its virtual tokens to a 2-D attention mask (and drops position_ids), so the sequences "
            "sharing a row could not be kept apart",
            "Set " + " and ".join(f"{name}=False" for name in on),
        )
