"""`replayrl kto [--config recipe.yaml] [--<field> value ...]`: train with KTO, plot, summarise.

Every `KTOConfig` field (TRL 1.16's, so every `transformers.TrainingArguments` field too) is a flag, plus
`ModelConfig`'s (--model_name_or_path, loading options, --use_peft and LoRA, as TRL's `trl kto`), --dataset_name
(rows prompt/completion/label, or chosen/rejected pairs, which are unpaired), --dataset_split, --dataset_test_split.
Values: CLI defaults < the built-in job's settings (only without a model and a dataset) < the --config recipe <
flags.

Built-in job: `replayrl dpo`'s addition preferences (chosen: the sum; rejected: the sum badly formed), unpaired
into thumbs-up / thumbs-down rows, on the warmed-up tiny addition policy; evaluated on the 20 held-out operand
pairs it never trains on. Offline, well under a minute on CPU.
"""

from __future__ import annotations

from typing import Any

from replayrl.cli.common import ScriptArguments, builtin_job_logging, model_loading, parse_command, run_job
from replayrl.cli.preference import DESCRIPTION, describe, job_inputs
from replayrl.kto import KTOConfig
from replayrl.models.model_config import ModelConfig
from replayrl.tasks import addition

DEFAULT_CONFIG: dict[str, Any] = {
    "learning_rate": 1e-3,
    "lr_scheduler_type": "linear",
    "beta": 0.1,
    "max_steps": 100,
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 80,
    "max_length": 32,
    "bf16": False,  # the tiny model runs faster in fp32 on CPU
    "gradient_checkpointing": False,
    **builtin_job_logging(eval_steps=20),
}


def run(argv: list[str]) -> int:
    types = (ScriptArguments, ModelConfig, KTOConfig)
    description = DESCRIPTION.format(name="KTO")
    script, model_args, config = parse_command("kto", types, argv, DEFAULT_CONFIG, description=description)

    def build():
        from replayrl.kto import KTOTrainer

        train, evaluation, model, tokenizer = job_inputs(script, model_args, config, addition.build_default_model)
        data = {"train_dataset": train, "eval_dataset": evaluation, "processing_class": tokenizer}
        return KTOTrainer(model, args=config, peft_config=model_loading(model_args, config), **data)

    job = f"{describe(script, model_args, ', unpaired')}; loss_type {config.loss_type}, beta {config.beta}"
    tiny = model_args.model_name_or_path is None
    return run_job("kto", config, build, job, summary=("rewards/margins", "loss"), tiny=tiny, saved="final model")
