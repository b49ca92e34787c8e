"""`DistillationConfig`: TRL 1.16's `DistillationConfig`, every field with TRL's default, on TrainingArguments.

Refused with the reason (not wired to replayrl's DistillationTrainer): `use_vllm=True` (and so the `vllm_*`
options' effect), `max_tool_calling_iterations`, `log_unique_prompts`; `teacher_model_revision` (no hub here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replayrl.training_args import TRLBaseArguments, resolve_pad_to_multiple_of


def _help(text: str) -> dict:
    return {"help": text}


def _json(value):
    if isinstance(value, str):
        import json

        return json.loads(value)
    return value


@dataclass
class DistillationConfig(TRLBaseArguments):
    r"""Configuration for [`DistillationTrainer`] (TRL 1.16's names and defaults). Every field is also a
    `replayrl distillation --<field>` flag."""

    # Model and teacher
    model_init_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata=_help("Keyword arguments for `from_pretrained` when `model` is a name or path.")
    )
    trust_remote_code: bool = field(default=False, metadata=_help("Allow models that ship custom code."))
    teacher_model_name_or_path: str | None = field(
        default=None, metadata=_help("The teacher, when the trainer is given no teacher_model.")
    )
    teacher_model_revision: str | None = field(default=None, metadata=_help("Hub revision of the teacher (refused)."))
    teacher_model_init_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata=_help("Keyword arguments for the teacher's `from_pretrained`.")
    )
    disable_dropout: bool = field(default=False, metadata=_help("Disable dropout in the student."))
    # Data and generation
    remove_unused_columns: bool | None = field(default=False, metadata=_help("Keep only the prompt column."))
    max_completion_length: int | None = field(default=512, metadata=_help("Tokens generated per completion."))
    ds3_gather_for_generation: bool = field(default=True, metadata=_help("DeepSpeed ZeRO-3: gather for generation."))
    shuffle_dataset: bool = field(default=True, metadata=_help("Shuffle the training prompts."))
    pad_to_multiple_of: int | str | None = field(
        default="auto", metadata=_help("Pad widths to a multiple of this; 'auto': no padding off Neuron.")
    )
    temperature: float = field(
        default=1.0, metadata=_help("Sampling temperature, also applied to both models' logits.")
    )
    top_p: float = field(default=1.0, metadata=_help("Nucleus sampling probability mass."))
    top_k: int = field(default=0, metadata=_help("Top-k filtering; 0 disables it."))
    min_p: float | None = field(default=None, metadata=_help("Minimum token probability relative to the top token."))
    generation_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata=_help("Extra `GenerationConfig` values; they override the options above.")
    )
    chat_template_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata=_help("Keyword arguments of the chat template (conversational prompts).")
    )
    repetition_penalty: float = field(default=1.0, metadata=_help("Repetition penalty (>1 discourages repeats)."))
    cache_implementation: str | None = field(default=None, metadata=_help("KV-cache implementation for generate."))
    use_vllm: bool = field(default=False, metadata=_help("Generate with vLLM (not wired here: refused)."))
    vllm_mode: str = field(default="colocate", metadata=_help("vLLM mode (unused: use_vllm is refused)."))
    vllm_model_impl: str = field(default="vllm", metadata=_help("vLLM model implementation (unused)."))
    vllm_enable_sleep_mode: bool = field(default=False, metadata=_help("vLLM sleep mode (unused)."))
    vllm_structured_outputs_regex: str | None = field(default=None, metadata=_help("vLLM regex (unused)."))
    vllm_server_base_url: str | None = field(default=None, metadata=_help("vLLM server URL (unused)."))
    vllm_server_host: str = field(default="0.0.0.0", metadata=_help("vLLM server host (unused)."))
    vllm_server_port: int = field(default=8000, metadata=_help("vLLM server port (unused)."))
    vllm_server_timeout: float = field(default=240.0, metadata=_help("vLLM server timeout (unused)."))
    vllm_group_port: int = field(default=51216, metadata=_help("vLLM NCCL group port (unused)."))
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata=_help("vLLM GPU memory share (unused)."))
    vllm_max_model_length: int | None = field(default=None, metadata=_help("vLLM context length (unused)."))
    vllm_tensor_parallel_size: int = field(default=1, metadata=_help("vLLM tensor parallel size (unused)."))
    # Loss
    beta: float = field(
        default=1.0, metadata=_help("Divergence: 0 forward KL(teacher||student), 1 reverse KL, between: JSD.")
    )
    # Tools and logging
    max_tool_calling_iterations: int | None = field(default=None, metadata=_help("Tool calling (refused)."))
    log_completions: bool = field(default=False, metadata=_help("Print sampled completions at each log step."))
    num_completions_to_print: int | None = field(default=None, metadata=_help("Rows printed (None: all)."))
    log_unique_prompts: bool = field(default=False, metadata=_help("One row per unique prompt (refused)."))

    def __post_init__(self):
        self.pad_to_multiple_of = resolve_pad_to_multiple_of(self.pad_to_multiple_of)
        for name in ("model_init_kwargs", "teacher_model_init_kwargs", "generation_kwargs", "chat_template_kwargs"):
            setattr(self, name, _json(getattr(self, name)))
        super().__post_init__()
        refusals = [
            (self.use_vllm, "use_vllm=True: vLLM generation is not wired to replayrl's DistillationTrainer yet"),
            (self.max_tool_calling_iterations is not None, "max_tool_calling_iterations: no tool calling here"),
            (self.log_unique_prompts, "log_unique_prompts=True is not implemented here"),
            (self.teacher_model_revision is not None, "teacher_model_revision: replayrl loads no hub revisions"),
        ]
        for bad, reason in refusals:
            if bad:
                raise ValueError(f"{reason}; leave it at its default.")
        checks = [
            (0.0 <= self.beta <= 1.0, f"beta must be in [0, 1] (got {self.beta})."),
            (self.temperature > 0, f"temperature must be > 0 (got {self.temperature})."),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1] (got {self.top_p})."),
            (
                self.max_completion_length is not None and self.max_completion_length >= 1,
                f"max_completion_length must be >= 1 (got {self.max_completion_length}).",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
