"""`replayrl grpo [--config recipe.yaml] [--<field> value ...]`: train with GRPO + replay buffer, plot, summarise.

`replayrl grpo` takes every `GRPOWithReplayBufferConfig` field (so every `transformers.TrainingArguments` field
too) as a flag, plus the `ScriptArguments` below. Each value comes from the highest of, lowest first:
  1. the CLI's own defaults: output_dir=runs/grpo-<time>, report_to=none;
  2. the built-in job's settings (`default_task.DEFAULT_CONFIG`), only when no model and no dataset are given;
  3. the recipe file given with --config (YAML: flag names without dashes as keys);
  4. flags on the command line.
Bad input (unknown flag or key, bad value, missing file, bad reward spec, invalid config) prints one line
`replayrl: error: ...` on stderr and exits with status 2; errors during training keep their traceback.
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import HfArgumentParser

from replayrl.cli.common import (
    PROG,
    ArgParser,
    CLIError,
    HelpFormatter,
    RaisingParserMixin,
    load_any_dataset,
    load_recipe,
    quiet_datasets,
    set_defaults,
)
from replayrl.cli.common import help_text as _help
from replayrl.metrics import METRICS_FILE, read_metrics, summary_lines
from replayrl.metrics.plot import plot_run
from replayrl.replay import GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from replayrl.rewards.builtin import RewardFunc, get_reward
from replayrl.tasks import addition as default_task


@dataclass
class ScriptArguments:
    """What to train on and how to score it; the training settings are the config's flags."""

    _argument_group_name = "script arguments (model, data, rewards)"

    config: str | None = field(
        default=None, metadata=_help("Recipe YAML of flag values (keys = flag names); flags given here override it.")
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata=_help("Model to train: a hub name or a local save_pretrained folder (None: the built-in tiny model)."),
    )
    dataset_name: str | None = field(
        default=None,
        metadata=_help(
            "Hub dataset name, a folder written by save_to_disk, a data folder, or a .json/.jsonl/.csv/.parquet "
            "file (None: the built-in addition task)."
        ),
    )
    dataset_config: str | None = field(default=None, metadata=_help("Dataset configuration name (e.g. 'main')."))
    dataset_split: str = field(default="train", metadata=_help("Split to train on."))
    dataset_test_split: str | None = field(
        default=None, metadata=_help("Split to evaluate on, with --eval_strategy steps|epoch (None: no evaluation).")
    )
    prompt_column: str = field(default="prompt", metadata=_help("Column holding the prompts; renamed to 'prompt'."))
    system_prompt: str | None = field(
        default=None,
        metadata=_help("If set, each prompt becomes a chat: this system message, then the prompt as the user turn."),
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata=_help(
            "Reward specs: length, length:<n>, regex:<pattern>, exact_match, boxed, or package.module:function. "
            "Required with --dataset_name (None: the built-in task's own reward, exact_match)."
        ),
    )


class _GRPOParser(RaisingParserMixin, HfArgumentParser):
    pass


# ---------------------------------------------------------------------------------------------- arguments
def build_grpo_parser() -> _GRPOParser:
    description = (
        "Train with GRPO and a replay buffer, then write checkpoints, the final model, metrics.jsonl and\n"
        "training.png to --output_dir and print a summary. Every value comes from, highest first: flags,\n"
        "the --config recipe, the built-in job's settings (only without a model and a dataset), defaults.\n"
        "The defaults shown below are those of this exact command line."
    )
    epilog = (
        "examples:\n"
        f"  {PROG} grpo                                            # built-in default job, offline, ~1 min on CPU\n"
        f"  {PROG} grpo --max_steps 100 --replay_buffer_size 0     # built-in job, shorter, without the buffer\n"
        f"  {PROG} grpo --config examples/qwen2_0.5b_math_boxed.yaml --learning_rate 2e-6\n"
        f"  {PROG} grpo --model_name_or_path ./my-model --dataset_name data.jsonl --prompt_column question \\\n"
        "      --reward_funcs boxed --num_generations 8 --replay_buffer_size 64"
    )
    parser = _GRPOParser(
        (ScriptArguments, GRPOWithReplayBufferConfig),
        prog=f"{PROG} grpo",
        usage=f"{PROG} grpo [-h] [--config RECIPE.yaml] [--<flag> VALUE ...]",
        description=description,
        epilog=epilog,
        formatter_class=HelpFormatter,
        allow_abbrev=False,  # with ~200 flags, prefix matching would turn typos into other flags
    )
    # Under "options" only -h; then the script arguments; then the config's ~200 fields under a title of their own.
    training = parser.add_argument_group("training arguments (GRPOWithReplayBufferConfig, incl. TrainingArguments)")
    moved = [a for a in parser._optionals._group_actions if a.dest != "help"]
    parser._optionals._group_actions[:] = [a for a in parser._optionals._group_actions if a.dest == "help"]
    training._group_actions.extend(moved)
    return parser


def parse_grpo_args(argv: list[str]) -> tuple[ScriptArguments, GRPOWithReplayBufferConfig]:
    """Resolve flags, recipe and defaults (see the module docstring) into the two dataclasses."""
    parser = build_grpo_parser()
    pre = _preparse(argv)
    recipe = load_recipe(pre.config) if pre.config else {}
    defaults: dict[str, Any] = {"output_dir": f"runs/grpo-{time.strftime('%Y%m%d-%H%M%S')}", "report_to": "none"}
    model = pre.model_name_or_path or recipe.get("model_name_or_path")
    dataset = pre.dataset_name or recipe.get("dataset_name")
    if model is None and dataset is None:
        defaults.update(default_task.DEFAULT_CONFIG)
    set_defaults(parser, defaults, "built-in defaults")
    set_defaults(parser, recipe, pre.config)
    try:
        script, config, remaining = parser.parse_args_into_dataclasses(
            argv, return_remaining_strings=True, look_for_args_file=False
        )
    except (ValueError, TypeError) as err:  # the config's own validation, with its fix-it message
        raise CLIError(str(err)) from err
    if remaining:
        raise CLIError(f"unrecognized arguments: {' '.join(remaining)} (see `{PROG} grpo --help`)")
    return script, config


def _preparse(argv: list[str]) -> argparse.Namespace:
    """The few values that decide the defaults: --config, --model_name_or_path, --dataset_name."""
    pre = ArgParser(add_help=False, allow_abbrev=False)
    for name in ("config", "model_name_or_path", "dataset_name"):
        pre.add_argument(f"--{name}", f"--{name.replace('_', '-')}", dest=name)
    return pre.parse_known_args(argv)[0]


def prepare_prompts(dataset: Dataset, prompt_column: str, system_prompt: str | None) -> Dataset:
    """Rename `prompt_column` to 'prompt'; with a system prompt, turn each prompt into a chat."""
    columns = dataset.column_names
    if prompt_column not in columns:
        raise CLIError(f"dataset has no column {prompt_column!r} (columns: {', '.join(columns)}); set --prompt_column")
    if prompt_column != "prompt":
        if "prompt" in columns:
            raise CLIError(f"dataset already has a 'prompt' column; cannot rename {prompt_column!r} to it")
        dataset = dataset.rename_column(prompt_column, "prompt")
    if system_prompt is None:
        return dataset

    def to_chat(row: dict) -> dict:
        prompt = row["prompt"]
        turns = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        return {"prompt": [{"role": "system", "content": system_prompt}, *turns]}

    with quiet_datasets():
        return dataset.map(to_chat)


def resolve_rewards(specs: list[str] | None, builtin_task: bool) -> list[RewardFunc]:
    if not specs:
        if builtin_task:
            return [default_task.task_reward()]
        raise CLIError(
            "--reward_funcs is required with --dataset_name, e.g. --reward_funcs exact_match "
            "(builtins: length, length:<n>, regex:<pattern>, exact_match, boxed; or package.module:function)"
        )
    try:
        return [get_reward(spec) for spec in specs]
    except (ValueError, TypeError) as err:
        raise CLIError(f"bad --reward_funcs: {err}") from err


def _datasets(script: ScriptArguments, config: GRPOWithReplayBufferConfig) -> tuple[Dataset, Dataset | None]:
    """(train, eval or None). The built-in task evaluates on its held-out prompts."""
    evaluating = config.eval_strategy != "no" or config.eval_on_start
    if script.dataset_name is None:
        train, held_out = default_task.task_datasets(config.seed)
        return train, held_out if evaluating else None
    if evaluating and not script.dataset_test_split:
        raise CLIError("evaluation is on (--eval_strategy / --eval_on_start) but no --dataset_test_split is given")
    load = [script.dataset_split] + ([script.dataset_test_split] if script.dataset_test_split else [])
    loaded = [load_any_dataset(script.dataset_name, script.dataset_config, split) for split in load]
    prepared = [prepare_prompts(ds, script.prompt_column, script.system_prompt) for ds in loaded]
    return prepared[0], prepared[1] if len(prepared) > 1 else None


# ---------------------------------------------------------------------------------------------- grpo command
def build_trainer(script: ScriptArguments, config: GRPOWithReplayBufferConfig) -> GRPOWithReplayBufferTrainer:
    """Datasets, rewards, model and trainer; any problem with them is a CLIError."""
    rewards = resolve_rewards(script.reward_funcs, builtin_task=script.dataset_name is None)
    train, evaluation = _datasets(script, config)
    model, tokenizer = (
        default_task.build_default_model(config.seed)
        if script.model_name_or_path is None
        else (script.model_name_or_path, None)
    )
    try:
        return GRPOWithReplayBufferTrainer(
            model=model,
            reward_funcs=rewards,
            args=config,
            train_dataset=train,
            eval_dataset=evaluation,
            processing_class=tokenizer,
        )
    except (ValueError, OSError) as err:  # model or tokenizer not found, reward_weights mismatch, ...
        raise CLIError(str(err)) from err


def _describe(script: ScriptArguments, config: GRPOWithReplayBufferConfig) -> str:
    if script.model_name_or_path is None and script.dataset_name is None:
        job = f"built-in default job: {default_task.TASK_DESCRIPTION} (replayrl/default_task.py)"
    else:
        model = script.model_name_or_path or "the built-in tiny model"
        job = f"{model} on {script.dataset_name or 'the built-in addition task'}"
    buffer = f"replay buffer {config.replay_buffer_size} groups" if config.replay_buffer_size else "no replay buffer"
    return f"{PROG} grpo: {job}; {buffer}; output_dir {config.output_dir}"


def run(argv: list[str]) -> int:
    start = time.perf_counter()
    script, config = parse_grpo_args(argv)
    # The built-in model is tiny: one torch thread is faster (see default_task.one_thread).
    with default_task.one_thread() if script.model_name_or_path is None else nullcontext():
        trainer = build_trainer(script, config)
        print(_describe(script, config), flush=True)
        resume = config.resume_from_checkpoint  # "true": the last checkpoint in output_dir, as Trainer.train(True)
        trainer.train(resume_from_checkpoint=True if str(resume).lower() == "true" else resume)
        trainer.save_model(config.output_dir)
    if trainer.is_world_process_zero():
        plot = plot_run(config.output_dir)
        _print_summary(config, trainer.state.global_step, time.perf_counter() - start, plot)
    return 0


def _print_summary(config: GRPOWithReplayBufferConfig, steps: int, seconds: float, plot: Path) -> None:
    out = Path(config.output_dir)
    records = read_metrics(out / METRICS_FILE)
    checkpoints = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    print(f"\n{PROG} grpo: done, {steps} optimizer steps in {seconds:.0f} s wall time")
    for line in summary_lines(records):
        print(f"  {line}")
    print(f"  final model + tokenizer: {out}/  (AutoModelForCausalLM / AutoTokenizer .from_pretrained)")
    print(f"  metrics: {out / METRICS_FILE}")
    print(f"  plot: {plot}  (re-draw: {PROG} plot {out})")
    if checkpoints:
        print(f"  last checkpoint: {checkpoints[-1]}")
