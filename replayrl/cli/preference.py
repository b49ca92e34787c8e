"""Shared plumbing of `replayrl dpo` and `replayrl reward`: arguments (defaults < built-in job < recipe <
flags, as `replayrl grpo`), preference datasets, the run and its summary. Each command module supplies its
config class, its built-in job and how to build its trainer."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser

from replayrl.cli.common import (
    PROG,
    CLIError,
    HelpFormatter,
    RaisingParserMixin,
    load_any_dataset,
    parse_with_recipe,
    run_dir,
)
from replayrl.cli.common import help_text as _help
from replayrl.metrics import METRICS_FILE, read_metrics, series
from replayrl.metrics.plot import plot_run


@dataclass
class ScriptArguments:
    """What to train on; the training settings are the config's flags."""

    _argument_group_name = "script arguments (model, data)"

    config: str | None = field(
        default=None, metadata=_help("Recipe YAML of flag values (keys = flag names); flags given here override it.")
    )
    model_name_or_path: str | None = field(
        default=None, metadata=_help("Model to train: a local save_pretrained folder or hub name (None: built-in).")
    )
    dataset_name: str | None = field(
        default=None,
        metadata=_help(
            "Preference data (chosen/rejected, optional prompt): hub name, save_to_disk folder, or a "
            ".json/.jsonl/.csv/.parquet file (None: the built-in addition preferences)."
        ),
    )
    dataset_config: str | None = field(default=None, metadata=_help("Dataset configuration name."))
    dataset_split: str = field(default="train", metadata=_help("Split to train on."))
    dataset_test_split: str | None = field(
        default=None, metadata=_help("Split to evaluate on, with --eval_strategy steps|epoch (None: no evaluation).")
    )


class _Parser(RaisingParserMixin, HfArgumentParser):
    pass


def parse_args(
    command: str, config_cls: type, builtin: dict[str, Any], argv: list[str], script_cls: type = ScriptArguments
) -> tuple[Any, Any]:
    """(script arguments, config) from argv; `builtin` are the built-in job's settings, used only without a
    model and a dataset."""
    parser = _Parser(
        (script_cls, config_cls),
        prog=f"{PROG} {command}",
        usage=f"{PROG} {command} [-h] [--config RECIPE.yaml] [--<flag> VALUE ...]",
        description=f"Train with {config_cls.__name__.removesuffix('Config')}; writes the model, metrics.jsonl and "
        "training.png to --output_dir. Without --model_name_or_path and --dataset_name: the built-in offline job.",
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    defaults = {"output_dir": run_dir(command), "report_to": "none"}
    script, config = parse_with_recipe(parser, argv, command, defaults, builtin)
    return script, config


def user_datasets(script: ScriptArguments, config) -> tuple[Any, Any]:
    """(train, eval or None) from --dataset_name."""
    evaluating = config.eval_strategy != "no" or config.eval_on_start
    if evaluating and not script.dataset_test_split:
        raise CLIError("evaluation is on (--eval_strategy / --eval_on_start) but no --dataset_test_split is given")
    train = load_any_dataset(script.dataset_name, script.dataset_config, script.dataset_split)
    test = None
    if script.dataset_test_split:
        test = load_any_dataset(script.dataset_name, script.dataset_config, script.dataset_test_split)
    return train, test


def job_inputs(script: ScriptArguments, config, build_default_model: Callable[[int], tuple]) -> tuple:
    """(train, eval or None, model, tokenizer or None): the built-in addition preferences (its held-out pairs for
    evaluation) and `build_default_model(seed)`, or the user's --dataset_name / --model_name_or_path. The datasets
    come first: their errors must come before the model's warm-up."""
    if script.dataset_name is None:
        from replayrl.tasks.preferences import preference_datasets

        train, held_out = preference_datasets(config.seed, per_problem=4)
        evaluation = held_out if config.eval_strategy != "no" or config.eval_on_start else None
    else:
        train, evaluation = user_datasets(script, config)
    if script.model_name_or_path is None:
        return (train, evaluation, *build_default_model(config.seed))
    return train, evaluation, script.model_name_or_path, None


def run_job(command: str, config, build: Callable[[], Any], describe: str, metric: str) -> int:
    """Build the trainer (ValueError/OSError -> CLIError), train, save, plot, print the summary."""
    start = time.perf_counter()
    try:
        trainer = build()
    except (ValueError, OSError) as err:
        raise CLIError(str(err)) from err
    print(f"{PROG} {command}: {describe}; output_dir {config.output_dir}", flush=True)
    trainer.train()
    trainer.save_model(config.output_dir)
    if trainer.is_world_process_zero():
        plot = plot_run(config.output_dir)
        out = Path(config.output_dir)
        print(f"\n{PROG} {command}: done, {trainer.state.global_step} optimizer steps in "
              f"{time.perf_counter() - start:.0f} s wall time")  # fmt: skip
        for line in summary_lines(read_metrics(out / METRICS_FILE), metric):
            print(f"  {line}")
        print(f"  final model: {out}/\n  metrics: {out / METRICS_FILE}\n  plot: {plot}  (re-draw: {PROG} plot {out})")
    return 0


def summary_lines(records: list[dict], metric: str) -> list[str]:
    """`metric` and `loss`, train and eval: first logged value -> last."""
    lines = []
    for key in (metric, f"eval_{metric}", "loss", "eval_loss"):
        _, values = series(records, key)
        if values:
            lines.append(f"{key}: {values[0]:.3f} -> {values[-1]:.3f} (first -> last log)")
    return lines
