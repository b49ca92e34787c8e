"""`replayrl sft [--config recipe.yaml] [--<field> value ...]`: supervised fine-tuning, plot, summary.

`replayrl sft` takes every `SFTConfig` field (so every `transformers.TrainingArguments` field too) as a flag,
plus the shared `ScriptArguments` and `ModelConfig` flags (TRL's names: loading options, --use_peft, LoRA).
Each value comes from the highest of, lowest first:
  1. the CLI's own defaults: output_dir=runs/sft-<time>, report_to=none;
  2. the built-in job's settings (`DEFAULT_CONFIG`), only when no model and no dataset are given;
  3. the recipe file given with --config (YAML: flag names without dashes as keys);
  4. flags on the command line.

The built-in job (no model, no dataset): a randomly initialised tiny Qwen2 (the addition task's model,
`replayrl.tasks.addition`) learns single-digit addition from prompt-completion pairs ("3+4=" -> "7"): 80 pairs
to train on, 20 held out; completion-only loss. It finishes in well under a minute on one CPU core and reports
loss and token accuracy (train and held-out) and how many held-out sums it answers exactly (greedy decoding).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from datasets import Dataset

from replayrl.cli.common import (
    PROG,
    ScriptArguments,
    builtin_job,
    builtin_job_logging,
    model_loading,
    parse_command,
    quiet_datasets,
    run_job,
    user_datasets,
)
from replayrl.models.model_config import ModelConfig
from replayrl.sft import SFTConfig, SFTTrainer
from replayrl.tasks import addition as task

JOB_DESCRIPTION = "SFT of a random tiny Qwen2 on single-digit addition (80 prompt-completion pairs, 20 held out)"
DEFAULT_CONFIG: dict[str, Any] = {
    "learning_rate": 3e-3,  # a 130k-parameter model from scratch; TRL's 2e-5 is for pretrained models
    "lr_scheduler_type": "constant",
    "max_steps": 200,  # held-out loss rises again after ~250 steps (80 training pairs)
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 20,
    "max_length": 16,
    **builtin_job_logging(eval_steps=50),
    "dataloader_pin_memory": False,  # CPU job: avoids torch's pin_memory warning
}


EPILOG = (
    "examples:\n"
    f"  {PROG} sft                                  # built-in offline job, < 1 min on CPU\n"
    f"  {PROG} sft --model_name_or_path ./my-model --dataset_name data.jsonl --packing true"
)


def parse_sft_args(argv: list[str]) -> tuple[ScriptArguments, ModelConfig, SFTConfig]:
    description = "Supervised fine-tuning; writes the model, metrics.jsonl and training.png to --output_dir."
    types = (ScriptArguments, ModelConfig, SFTConfig)
    return parse_command("sft", types, argv, DEFAULT_CONFIG, description=description, epilog=EPILOG)


def builtin_datasets(seed: int) -> tuple[Dataset, Dataset]:
    """(train, held-out) prompt-completion pairs of the addition task."""
    train, held_out = task.task_datasets(seed)
    return train.rename_column("answer", "completion"), held_out.rename_column("answer", "completion")


def build_trainer(script: ScriptArguments, model_args: ModelConfig, config: SFTConfig) -> SFTTrainer:
    if script.dataset_name is None:
        with quiet_datasets():
            train, held_out = builtin_datasets(config.seed)
        evaluation = held_out if config.eval_strategy != "no" or config.eval_on_start else None
    else:
        train, evaluation = user_datasets(script, config)
    if model_args.model_name_or_path is None:
        from replayrl.models.tiny import build_tiny_model, build_tokenizer

        tokenizer = build_tokenizer()
        model = build_tiny_model(tokenizer, seed=config.seed, **task.MODEL_KWARGS)
        model.config._name_or_path = "replayrl-tiny-adder"
    else:
        model, tokenizer = model_args.model_name_or_path, None
    with quiet_datasets() if script.dataset_name is None else nullcontext():
        data = {"train_dataset": train, "eval_dataset": evaluation, "processing_class": tokenizer}
        return SFTTrainer(model, args=config, peft_config=model_loading(model_args, config), **data)


def run(argv: list[str]) -> int:
    script, model_args, config = parse_sft_args(argv)
    tiny = model_args.model_name_or_path is None
    job = JOB_DESCRIPTION if tiny else f"{model_args.model_name_or_path} on {script.dataset_name}"

    def exact(trainer: SFTTrainer) -> list[str]:
        if not builtin_job(script, model_args):
            return []
        right, total = held_out_exact(trainer, config.seed)
        return [f"held-out sums answered exactly (greedy): {right}/{total}"]

    def build() -> SFTTrainer:
        return build_trainer(script, model_args, config)

    summary = ("loss", "mean_token_accuracy")
    return run_job("sft", config, build, job, summary=summary, tiny=tiny, after=exact)


def held_out_exact(trainer: SFTTrainer, seed: int) -> tuple[int, int]:
    """(held-out prompts whose greedy answer is exactly the sum, number of held-out prompts)."""
    import torch

    _, held_out = builtin_datasets(seed)
    tokenizer, model = trainer.processing_class, trainer.model.eval()
    ids = torch.tensor([tokenizer(p).input_ids for p in held_out["prompt"]], device=model.device)  # all 4 chars
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
    answers = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
    return sum(a.strip() == c for a, c in zip(answers, held_out["completion"])), len(answers)
