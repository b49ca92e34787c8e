"""`ModelConfig`: how to load the model and whether to train a LoRA adapter (TRL's `ModelConfig`, same flags).

A plain dataclass with no heavy imports, so every `replayrl <trainer>` command shares its flags
(`--model_name_or_path --dtype --attn_implementation --trust_remote_code --use_peft --lora_r ...`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class ModelArguments:
    """The model flag every `replayrl <trainer>` command has: what to train (None: the built-in job's tiny model).
    `ModelConfig` adds TRL's loading and LoRA flags for the commands whose trainer takes them."""

    _argument_group_name = "model"

    model_name_or_path: str | None = field(
        default=None,
        metadata=_help("Model to train: a hub name or a local save_pretrained folder (None: the built-in tiny model)."),
    )


@dataclass
class ModelConfig(ModelArguments):
    """Model loading and PEFT settings, as TRL's `ModelConfig`."""

    _argument_group_name = "model (ModelConfig)"

    model_revision: str = field(default="main", metadata=_help("Hub revision (branch, tag or commit) of the model."))
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = field(
        default=None, metadata=_help("Weights dtype when loading ('auto': as saved; None: float32).")
    )
    trust_remote_code: bool = field(
        default=False, metadata=_help("Run the model repository's own code (only for repositories you trust).")
    )
    attn_implementation: str | None = field(
        default=None, metadata=_help("Attention kernel: eager, sdpa, flash_attention_2, ... (None: transformers').")
    )
    use_peft: bool = field(default=False, metadata=_help("Train a LoRA adapter instead of all the weights."))
    lora_r: int = field(default=16, metadata=_help("LoRA rank."))
    lora_alpha: int = field(default=32, metadata=_help("LoRA alpha (scale = alpha / r)."))
    lora_dropout: float = field(default=0.05, metadata=_help("Dropout on the LoRA branch."))
    lora_target_modules: list[str] | None = field(
        default=None, metadata=_help("Modules to adapt, e.g. q_proj v_proj, or all-linear (None: PEFT's default).")
    )
    lora_modules_to_save: list[str] | None = field(
        default=None, metadata=_help("Modules trained in full beside the adapter (e.g. lm_head).")
    )
    lora_task_type: str = field(default="CAUSAL_LM", metadata=_help("PEFT task type (SEQ_CLS for reward models)."))
    use_rslora: bool = field(default=False, metadata=_help("Rank-stabilised LoRA: scale alpha / sqrt(r)."))
    use_dora: bool = field(default=False, metadata=_help("Weight-decomposed LoRA (DoRA)."))

    def __post_init__(self):
        if self.lora_r < 1:
            raise ValueError(f"lora_r must be >= 1 (got {self.lora_r}).")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"lora_dropout must be in [0, 1) (got {self.lora_dropout}).")
        if isinstance(self.lora_target_modules, list) and len(self.lora_target_modules) == 1:
            self.lora_target_modules = self.lora_target_modules[0]  # "all-linear" must be a str for PEFT


def model_init_kwargs(model_args: ModelConfig) -> dict[str, Any]:
    """`from_pretrained` keyword arguments from the model flags (only those that were set)."""
    kwargs: dict[str, Any] = {"revision": model_args.model_revision, "trust_remote_code": model_args.trust_remote_code}
    if model_args.dtype is not None:
        kwargs["dtype"] = model_args.dtype
    if model_args.attn_implementation is not None:
        kwargs["attn_implementation"] = model_args.attn_implementation
    return kwargs


def get_peft_config(model_args: ModelConfig):
    """A `peft.LoraConfig` from the flags, or None without `use_peft` (as TRL's `get_peft_config`)."""
    if not model_args.use_peft:
        return None
    try:
        from peft import LoraConfig
    except ImportError as err:
        raise ImportError("use_peft=True needs peft: pip install replayrl[peft]") from err
    return LoraConfig(
        task_type=model_args.lora_task_type,
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=model_args.lora_target_modules,
        modules_to_save=model_args.lora_modules_to_save,
        use_rslora=model_args.use_rslora,
        use_dora=model_args.use_dora,
        bias="none",
    )
