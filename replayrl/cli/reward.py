"""`replayrl reward [--config recipe.yaml] [--<field> value ...]`: train a reward model, plot, summarise.

Every `RewardConfig` field is a flag, plus --model_name_or_path (loaded as AutoModelForSequenceClassification
with num_labels=1), --dataset_name, --dataset_split, --dataset_test_split. Values: CLI defaults < the built-in
job's settings (only without a model and a dataset) < the --config recipe < flags.

Built-in job: a tiny randomly initialised Qwen2 reward model trained on "a+b=" pairs (chosen: the sum,
rejected: the sum badly formed, e.g. "x12", "12?", "12 12") of 80 operand pairs, evaluated on pairs of the 20
held-out operand pairs, which it never saw: it must learn the rule, not the training answers. Offline, ~10 s
on CPU.
"""

from __future__ import annotations

from typing import Any

from replayrl.cli.common import ModelArguments, ScriptArguments, builtin_job_logging, parse_command, run_job
from replayrl.cli.preference import DESCRIPTION, describe, job_inputs
from replayrl.models.tiny import build_tiny_sequence_classifier, build_tokenizer
from replayrl.reward import RewardConfig, RewardTrainer
from replayrl.tasks import addition

DEFAULT_CONFIG: dict[str, Any] = {
    "learning_rate": 1e-3,
    "lr_scheduler_type": "constant",
    "max_steps": 100,  # held-out accuracy is 1.0 by step 50 on seeds 0-2 (docs/reward.md)
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 80,
    "max_length": 32,
    **builtin_job_logging(eval_steps=25),
}


def build_default_reward_model(seed: int):
    """A randomly initialised tiny Qwen2 with a scalar head (num_labels=1), same size as the addition policy."""
    tokenizer = build_tokenizer()
    model = build_tiny_sequence_classifier(tokenizer, seed=seed, **addition.MODEL_KWARGS)
    model.config._name_or_path = "replayrl-tiny-adder-rm"
    return model, tokenizer


def run(argv: list[str]) -> int:
    types = (ScriptArguments, ModelArguments, RewardConfig)
    description = DESCRIPTION.format(name="a reward model")
    script, model_args, config = parse_command("reward", types, argv, DEFAULT_CONFIG, description=description)

    def build() -> RewardTrainer:
        train, evaluation, model, tokenizer = job_inputs(script, model_args, config, build_default_reward_model)
        return RewardTrainer(
            model, args=config, train_dataset=train, eval_dataset=evaluation, processing_class=tokenizer
        )

    tiny = model_args.model_name_or_path is None
    job = describe(script, model_args)
    return run_job("reward", config, build, job, summary=("accuracy", "loss"), tiny=tiny, saved="final model")
