"""`replayrl rloo [--config recipe.yaml] [--<field> value ...]`: train with RLOO, plot, summarise.

Every `RLOOConfig` field (TRL 1.16's, so every `transformers.TrainingArguments` field too) is a flag, plus the
script arguments below. Values: CLI defaults < the built-in job's settings (only without a model and a dataset) <
the --config recipe < flags.

Built-in job: `replayrl grpo`'s addition task (replayrl/tasks/addition.py: a tiny Qwen2 warmed up on a noisy
teacher, right about a quarter of the time, 0/1 exact-match reward) trained with RLOO's leave-one-out baseline;
evaluated on the 20 held-out operand pairs it never trains on. Offline, about a minute on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replayrl.cli.common import ModelArguments, ScriptArguments, builtin_job, parse_command, run_job, user_datasets
from replayrl.cli.common import help_text as _help
from replayrl.cli.grpo import prepare_prompts, resolve_rewards
from replayrl.rloo import RLOOConfig
from replayrl.tasks import addition

DEFAULT_CONFIG: dict[str, Any] = {
    **{k: v for k, v in addition.DEFAULT_CONFIG.items() if not k.startswith("replay_")},
    "max_steps": 200,
    "beta": 0.05,  # TRL's RLOO default: the KL panel of the plot
    "bf16": False,  # the tiny model runs faster in fp32 on CPU
    "gradient_checkpointing": False,
    "save_steps": 100,
}
# the built-in job's held-out curve rises with 8 completions per prompt; TRL's default is 2
DEFAULT_CONFIG["num_generations"] = 8


@dataclass
class RLOOScriptArguments(ScriptArguments):
    """The shared data flags, plus what RL needs: the prompt column and the rewards."""

    dataset_name: str | None = field(
        default=None,
        metadata=_help("Prompts: hub name, save_to_disk folder or data file (None: the built-in addition task)."),
    )
    prompt_column: str = field(default="prompt", metadata=_help("Column holding the prompts; renamed to 'prompt'."))
    reward_funcs: list[str] | None = field(
        default=None,
        metadata=_help("Rewards: length, length:<n>, regex:<pattern>, exact_match, boxed, module.function."),
    )


def build_trainer(script: RLOOScriptArguments, model_args: ModelArguments, config: RLOOConfig):
    from replayrl.rloo import RLOOTrainer

    builtin = script.dataset_name is None
    rewards = resolve_rewards(script.reward_funcs, None, builtin)
    if builtin:
        train, held_out = addition.task_datasets(config.seed)
        evaluation = held_out if config.eval_strategy != "no" or config.eval_on_start else None
    else:
        train, evaluation = user_datasets(script, config)
        train = prepare_prompts(train, script.prompt_column, None)
        evaluation = None if evaluation is None else prepare_prompts(evaluation, script.prompt_column, None)
    if model_args.model_name_or_path is None:
        model, tokenizer = addition.build_default_model(config.seed)
    else:
        model, tokenizer = model_args.model_name_or_path, None
    return RLOOTrainer(model, rewards, args=config, train_dataset=train, eval_dataset=evaluation,
                       processing_class=tokenizer)  # fmt: skip


def run(argv: list[str]) -> int:
    types = (RLOOScriptArguments, ModelArguments, RLOOConfig)
    script, model_args, config = parse_command("rloo", types, argv, DEFAULT_CONFIG, description="Train with RLOO.")
    describe = f"{model_args.model_name_or_path} on {script.dataset_name}"
    if builtin_job(script, model_args):
        describe = f"built-in job: {addition.TASK_DESCRIPTION}"
    describe += f"; G={config.num_generations}, beta {config.beta}"
    tiny = model_args.model_name_or_path is None
    build = lambda: build_trainer(script, model_args, config)  # noqa: E731
    return run_job("rloo", config, build, describe, summary=("reward", "loss"), tiny=tiny, saved="final model")
