"""What `replayrl dpo`, `replayrl reward` and `replayrl kto` share: their inputs (the built-in addition preferences
and model, or the user's dataset and model) and the job's description. Parsing and the run are
`replayrl.cli.common`'s."""

from __future__ import annotations

from collections.abc import Callable

from replayrl.cli.common import ModelArguments, ScriptArguments, builtin_job, user_datasets

DESCRIPTION = (
    "Train with {name}; writes the model, metrics.jsonl and training.png to --output_dir. Without "
    "--model_name_or_path and --dataset_name: the built-in offline job."
)


def job_inputs(
    script: ScriptArguments, model_args: ModelArguments, config, build_default_model: Callable[[int], tuple]
) -> tuple:
    """(train, eval or None, model, tokenizer or None): the built-in addition preferences (its held-out pairs for
    evaluation) and `build_default_model(seed)`, or the user's --dataset_name / --model_name_or_path. The datasets
    come first: their errors must come before the model's warm-up."""
    if script.dataset_name is None:
        from replayrl.tasks.preferences import preference_datasets

        train, held_out = preference_datasets(config.seed, per_problem=4)
        evaluation = held_out if config.eval_strategy != "no" or config.eval_on_start else None
    else:
        train, evaluation = user_datasets(script, config)
    if model_args.model_name_or_path is None:
        return (train, evaluation, *build_default_model(config.seed))
    return train, evaluation, model_args.model_name_or_path, None


def describe(script: ScriptArguments, model_args: ModelArguments, suffix: str = "") -> str:
    """'built-in job: <task><suffix>' or '<model> on <dataset>'."""
    if builtin_job(script, model_args):
        from replayrl.tasks.preferences import TASK_DESCRIPTION

        return f"built-in job: {TASK_DESCRIPTION}{suffix}"
    return f"{model_args.model_name_or_path or 'the built-in tiny model'} on {script.dataset_name or 'built-in pairs'}"
