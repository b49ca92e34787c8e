"""`DistillationConfig`: TRL 1.16's `DistillationConfig`, every field with TRL's default, on TrainingArguments.

`use_vllm=True` generates with replayrl's vLLM backends (colocate or a `replayrl vllm-serve` server, docs/vllm.md),
as GRPO does. Refused with the reason: `max_tool_calling_iterations`, `log_unique_prompts`;
`teacher_model_revision` (no hub here).
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
    use_vllm: bool = field(default=False, metadata=_help("Generate with vLLM (`pip install replayrl[vllm]`)."))
    vllm_mode: str = field(
        default="colocate", metadata=_help("'colocate' (in-process engine) or 'server' (`replayrl vllm-serve`).")
    )
    vllm_model_impl: str = field(default="vllm", metadata=_help("Model implementation: 'vllm' or 'transformers'."))
    vllm_enable_sleep_mode: bool = field(default=False, metadata=_help("Colocate on a GPU: offload between steps."))
    vllm_structured_outputs_regex: str | None = field(default=None, metadata=_help("vLLM regex (not supported)."))
    vllm_server_base_url: str | None = field(default=None, metadata=_help("Server URL (overrides host and port)."))
    vllm_server_host: str = field(default="0.0.0.0", metadata=_help("Server host (0.0.0.0: this machine)."))
    vllm_server_port: int = field(default=8000, metadata=_help("Server port."))
    vllm_server_timeout: float = field(default=240.0, metadata=_help("Seconds to wait for the server to be up."))
    vllm_group_port: int = field(default=51216, metadata=_help("NCCL group port (unused: weights go by folder)."))
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata=_help("Colocate: the engine's memory share."))
    vllm_max_model_length: int | None = field(
        default=None, metadata=_help("Colocate: the engine's context length (None: the model's context length).")
    )
    vllm_tensor_parallel_size: int = field(default=1, metadata=_help("Colocate: tensor parallel size."))
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
        if self.use_vllm:
            from replayrl.generation import check_vllm_config

            check_vllm_config(self)
