"""`replayrl distillation [--config recipe.yaml] [--<field> value ...]`: on-policy distillation, plot, summarise.

Every `DistillationConfig` field (TRL 1.16's, so every `transformers.TrainingArguments` field too) is a flag, among
them --teacher_model_name_or_path, plus `ModelConfig`'s (--model_name_or_path: the student; loading options, which
reach the teacher too as in TRL's `trl distillation`; --use_peft and LoRA for the student), --dataset_name (a
`prompt` column), --dataset_split, --dataset_test_split. Values: CLI defaults < the built-in job's settings (only
without a model and a dataset) < the --config recipe < flags.

Built-in job: the teacher is `replayrl grpo`'s warmed-up tiny addition policy (replayrl/tasks/addition.py); the
student a tiny Qwen2 of the same size with random weights. The student samples answers to the addition prompts and
learns the teacher's next-token distributions on them (reverse KL, TRL's beta=1.0); the divergence on the 20
held-out prompts, which it never trains on, shows the distillation. Offline, about a minute on CPU.
"""

from __future__ import annotations

from typing import Any

from replayrl.cli.common import (
    CLIError,
    ScriptArguments,
    builtin_job,
    builtin_job_logging,
    model_loading,
    parse_command,
    run_job,
    user_datasets,
)
from replayrl.distillation import DistillationConfig
from replayrl.models.model_config import ModelConfig
from replayrl.tasks import addition

DEFAULT_CONFIG: dict[str, Any] = {
    "learning_rate": 3e-3,
    "lr_scheduler_type": "constant",
    "max_steps": 100,
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 20,
    "max_completion_length": 4,
    "bf16": False,  # the tiny models run faster in fp32 on CPU
    "gradient_checkpointing": False,
    **builtin_job_logging(eval_steps=20),
}


def build_trainer(script: ScriptArguments, model_args: ModelConfig, config: DistillationConfig):
    from replayrl.distillation import DistillationTrainer
    from replayrl.models.tiny import build_tiny_model

    if script.dataset_name is None:
        train, held_out = addition.task_datasets(config.seed)
        evaluation = held_out if config.eval_strategy != "no" or config.eval_on_start else None
    else:
        train, evaluation = user_datasets(script, config)
    if model_args.model_name_or_path is None:
        teacher, tokenizer = addition.build_default_model(config.seed)
        student = build_tiny_model(tokenizer, seed=config.seed + 1, **addition.MODEL_KWARGS)
        return DistillationTrainer(student, teacher, args=config, train_dataset=train, eval_dataset=evaluation,
                                   processing_class=tokenizer)  # fmt: skip
    if config.teacher_model_name_or_path is None:
        raise CLIError("--teacher_model_name_or_path is required with --model_name_or_path")
    peft_config = model_loading(model_args, config)
    config.teacher_model_init_kwargs = teacher_loading(model_args, config.teacher_model_init_kwargs)
    return DistillationTrainer(model_args.model_name_or_path, args=config, train_dataset=train,
                               eval_dataset=evaluation, peft_config=peft_config)  # fmt: skip


def teacher_loading(model_args: ModelConfig, given: dict | None) -> dict | None:
    """The teacher's `from_pretrained` keyword arguments: --dtype and --attn_implementation as for the student
    (TRL's `trl distillation` does the same), under the config's own `teacher_model_init_kwargs`."""
    shared = {"dtype": model_args.dtype, "attn_implementation": model_args.attn_implementation}
    kwargs = {**{k: v for k, v in shared.items() if v is not None}, **(given or {})}
    return kwargs or None


def run(argv: list[str]) -> int:
    types = (ScriptArguments, ModelConfig, DistillationConfig)
    description = "On-policy distillation: the student samples, the teacher's distributions are the target."
    script, model_args, config = parse_command("distillation", types, argv, DEFAULT_CONFIG, description=description)
    describe = f"{model_args.model_name_or_path} <- {config.teacher_model_name_or_path} on {script.dataset_name}"
    if builtin_job(script, model_args):
        describe = "built-in job: a random tiny student distils the warmed-up addition policy on a+b= prompts"
    describe += f"; beta {config.beta}"
    tiny = model_args.model_name_or_path is None
    build = lambda: build_trainer(script, model_args, config)  # noqa: E731
    return run_job("distillation", config, build, describe, summary=("divergence", "loss"), tiny=tiny,
                   saved="final model")  # fmt: skip
