"""`replayrl dpo [--config recipe.yaml] [--<field> value ...]`: train with DPO, plot, summarise.

Every `DPOConfig` field (so every `transformers.TrainingArguments` field too) is a flag, plus `ModelConfig`'s
(--model_name_or_path, loading options, --use_peft and LoRA), --dataset_name, --dataset_split, --dataset_test_split.
Values: CLI defaults < the built-in job's settings (only
without a model and a dataset) < the --config recipe < flags.

Built-in job: the tiny addition policy of `replayrl grpo` (warmed up on a noisy teacher, right about a quarter
of the time) trained with DPO on preference pairs "a+b=" -> chosen: the sum, rejected: the sum badly formed (e.g. "x12",
"12?", "12 12"); evaluated on pairs of the 20 held-out operand pairs, which it never trained on. Offline,
< 1 minute on CPU.
"""

from __future__ import annotations

from typing import Any

from replayrl.cli.common import ScriptArguments, builtin_job_logging, model_loading, parse_command, run_job
from replayrl.cli.preference import DESCRIPTION, describe, job_inputs
from replayrl.dpo import DPOConfig, DPOTrainer
from replayrl.models.model_config import ModelConfig
from replayrl.tasks import addition

DEFAULT_CONFIG: dict[str, Any] = {
    "learning_rate": 1e-3,
    "lr_scheduler_type": "linear",  # decayed to 0: the held-out accuracy settles instead of wobbling
    "beta": 0.1,
    "max_steps": 100,  # held-out accuracy >= 0.975 from step 20 and 1.0 at 100 on seeds 0-2 (docs/dpo.md)
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 80,
    "max_prompt_length": 16,
    "max_length": 32,
    **builtin_job_logging(eval_steps=20),
}


def run(argv: list[str]) -> int:
    types = (ScriptArguments, ModelConfig, DPOConfig)
    description = DESCRIPTION.format(name="DPO")
    script, model_args, config = parse_command("dpo", types, argv, DEFAULT_CONFIG, description=description)

    def build() -> DPOTrainer:
        train, evaluation, model, tokenizer = job_inputs(script, model_args, config, addition.build_default_model)
        data = {"train_dataset": train, "eval_dataset": evaluation, "processing_class": tokenizer}
        return DPOTrainer(model, args=config, peft_config=model_loading(model_args, config), **data)

    job = f"{describe(script, model_args)}; loss_type {','.join(config.loss_type)}, beta {config.beta}"
    tiny = model_args.model_name_or_path is None
    return run_job("dpo", config, build, job, summary=("rewards/accuracies", "loss"), tiny=tiny, saved="final model")
