"""`TrainingArguments`: transformers' own, plus what every replayrl trainer's config shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments as _HFTrainingArguments


@dataclass
class TrainingArguments(_HFTrainingArguments):
    """transformers' `TrainingArguments` plus `overwrite_output_dir` (dropped by transformers 5, which replayrl
    brings back because it refuses to start a fresh run in a directory holding an earlier run's checkpoints) and
    `memory_efficient_layers` (replayrl's own: `replayrl.models.lean_layers`)."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start afresh in an output_dir that holds checkpoints, deleting them. Without it such a "
            "directory is refused unless resume_from_checkpoint is set."
        },
    )
    memory_efficient_layers: bool = field(
        default=True,
        metadata={
            "help": "RMSNorm and SwiGLU MLP layers (Llama/Qwen/Mistral families) that keep fewer activations for "
            "the backward pass: the same forward, about a third less activation memory (replayrl.models."
            "lean_layers). False: the modules' own forward."
        },
    )


def trl_bf16_default(bf16: bool | None, fp16: bool, use_cpu: bool) -> bool:
    """TRL's `bf16=None`: bf16 unless fp16 is set, but only where bf16 can run (a bf16-capable GPU, or use_cpu);
    elsewhere (e.g. a CPU-only machine without use_cpu=True) transformers would refuse to start, so fp32."""
    if bf16 is not None:
        return bf16
    if fp16:
        return False
    import torch

    return use_cpu or (torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def resolve_pad_to_multiple_of(value: int | str | None) -> int | None:
    """TRL's `pad_to_multiple_of`: "auto" pads only on Neuron (never here), so None; strings from the CLI -> int."""
    if isinstance(value, str):
        return None if value.lower() in ("auto", "none", "null") else int(value)
    return value


def warn_pad_token_deprecated(pad_token: str | None) -> None:
    """TRL 1.16's FutureWarning for the `pad_token` config field (still applied, as TRL still applies it)."""
    if pad_token is not None:
        import warnings

        warnings.warn(
            "`pad_token` is deprecated and will be removed in v2.0.0. Set `tokenizer.pad_token` directly and pass it "
            "as `processing_class` to the trainer instead.",
            FutureWarning,
            stacklevel=4,
        )


def check_pad_to_multiple_of(value: int | None) -> None:
    """`pad_to_multiple_of` once resolved: None or a positive integer."""
    if value is not None and value < 1:
        raise ValueError(f"pad_to_multiple_of={value}: must be a positive integer, 'auto' or None.")


@dataclass
class TRLBaseArguments(TrainingArguments):
    """TRL 1.16's `_BaseConfig`: the TrainingArguments defaults every TRL trainer config changes."""

    learning_rate: float = field(default=1e-6, metadata={"help": "AdamW learning rate (TRL's default 1e-6)."})
    logging_steps: float = field(default=10, metadata={"help": "Log every N optimizer steps."})
    gradient_checkpointing: bool = field(
        default=True, metadata={"help": "Recompute activations in the backward pass (TRL's default: on)."}
    )
    bf16: bool | None = field(
        default=None, metadata={"help": "bf16 mixed precision; None (TRL): on unless fp16 is set, where bf16 can run."}
    )

    def __post_init__(self):
        self.bf16 = trl_bf16_default(self.bf16, self.fp16, self.use_cpu)
        super().__post_init__()
