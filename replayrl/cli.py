"""The `replayrl` command line (also `python -m replayrl`).

    replayrl grpo [--config recipe.yaml] [--<field> value ...]   train with GRPO + replay buffer, plot, summarise
    replayrl plot RUN_DIR [--output file.png]                     re-draw a run's plot from its metrics.jsonl

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
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import yaml
from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from transformers import HfArgumentParser

from replayrl import __version__, default_task
from replayrl.builtin_rewards import RewardFunc, get_reward
from replayrl.plotting import METRICS_FILE, MetricsFileCallback, plot_run, read_metrics, summary_lines
from replayrl.replay import GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer

PROG = "replayrl"
USAGE = f"""usage: {PROG} <command> [options]

commands:
  grpo    train a model with GRPO and a replay buffer; with no model and no dataset, runs the built-in
          default job ({default_task.TASK_DESCRIPTION})
  plot    re-draw the plot of a run directory from its {METRICS_FILE}

`{PROG} <command> --help` lists a command's options; `{PROG} --version` prints the version."""
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


class CLIError(Exception):
    """Bad user input: reported as one line on stderr, exit status 2."""


def _help(text: str) -> dict:
    return {"help": text}


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


class _RaisingParserMixin:
    def error(self, message: str):
        # argparse would print the usage block and exit; one line (printed by main) is easier to read.
        raise CLIError(message)


class _ArgParser(_RaisingParserMixin, argparse.ArgumentParser):
    pass


class _GRPOParser(_RaisingParserMixin, HfArgumentParser):
    pass


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    def _format_action_invocation(self, action: argparse.Action) -> str:
        # Show `--flag_name VALUE` once; HfArgumentParser's `--flag-name` alias works too but doubles every line.
        if not action.option_strings:
            return super()._format_action_invocation(action)
        names = ", ".join(s for s in action.option_strings if "-" not in s.lstrip("-")) or action.option_strings[0]
        if action.nargs == 0:
            return names
        return f"{names} {self._format_args(action, self._get_default_metavar_for_optional(action))}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `replayrl` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _dispatch(argv)
    except CLIError as err:
        print(f"{PROG}: error: {_one_line(str(err))}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # argparse's --help
        return exit_.code if isinstance(exit_.code, int) else 0


def _dispatch(argv: list[str]) -> int:
    if not argv:
        raise CLIError(f"missing command: grpo or plot (see `{PROG} --help`)")
    command, rest = argv[0], argv[1:]
    if command in ("-h", "--help"):
        print(USAGE)
        return 0
    if command == "--version":
        print(f"{PROG} {__version__}")
        return 0
    if command == "grpo":
        return grpo_command(rest)
    if command == "plot":
        return plot_command(rest)
    raise CLIError(f"unknown command {command!r}: expected grpo or plot (see `{PROG} --help`)")


def _one_line(text: str) -> str:
    return " ".join(text.split())


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
        formatter_class=_HelpFormatter,
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
    _set_defaults(parser, defaults, "built-in defaults")
    _set_defaults(parser, recipe, pre.config)
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
    pre = _ArgParser(add_help=False, allow_abbrev=False)
    for name in ("config", "model_name_or_path", "dataset_name"):
        pre.add_argument(f"--{name}", f"--{name.replace('_', '-')}", dest=name)
    return pre.parse_known_args(argv)[0]


def load_recipe(path: str) -> dict[str, Any]:
    """A recipe YAML as {flag name: value}; dashes in keys read as underscores."""
    file = Path(path)
    if not file.is_file():
        raise CLIError(f"recipe file not found: {path}")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise CLIError(f"cannot parse recipe {path}: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CLIError(f"recipe {path} must be a mapping of flag names to values, got {type(data).__name__}")
    return {str(key).replace("-", "_"): value for key, value in data.items()}


def _set_defaults(parser: argparse.ArgumentParser, values: dict[str, Any], source: str) -> None:
    """Make `values` the parser's defaults (so flags still override them), typed as if given as flags."""
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    converted = {}
    for key, value in values.items():
        if key not in actions:
            raise CLIError(f"{source}: unknown key {key!r}; keys are `{PROG} grpo` flag names (see --help)")
        converted[key] = _convert(actions[key], value, f"{source}: {key}")
    parser.set_defaults(**converted)


def _convert(action: argparse.Action, value: Any, where: str) -> Any:
    """Apply the flag's type to a YAML value: PyYAML reads `1e-6` as a string and `[a, b]` as a list."""
    if value is None or action.type is None:
        return value
    if action.nargs == "+":
        return [_convert_one(action, v, where) for v in (value if isinstance(value, list) else [value])]
    return _convert_one(action, value, where)


def _convert_one(action: argparse.Action, value: Any, where: str) -> Any:
    if isinstance(value, str):
        try:
            value = action.type(value)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as err:
            raise CLIError(f"{where}: invalid value {value!r} ({err})") from err
    if action.choices is not None and value not in action.choices:
        raise CLIError(f"{where}: invalid choice {value!r} (choose from {', '.join(map(str, action.choices))})")
    return value


# ---------------------------------------------------------------------------------------------- data and rewards
def load_prompt_dataset(name: str, config_name: str | None, split: str) -> Dataset:
    """One split of a hub dataset, a save_to_disk folder, a data folder or a single data file."""
    path = Path(name).expanduser()
    builder = FILE_BUILDERS.get(path.suffix.lower())
    if builder and not path.is_file():
        raise CLIError(f"dataset file not found: {name}")
    try:
        if builder:  # one file is one split, whatever it is called
            with _quiet_datasets():
                return load_dataset(builder, data_files={split: str(path)}, split=split)
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            return _pick_split(load_from_disk(str(path)), split, name)
        # hub datasets keep their progress bars: downloads can take a while
        with _quiet_datasets() if path.is_dir() else nullcontext():
            return load_dataset(name, config_name, split=split)
    except CLIError:
        raise
    except Exception as err:  # loaders raise many types: DatasetNotFoundError, ConnectionError, ValueError, ...
        raise CLIError(f"could not load split {split!r} of dataset {name!r}: {err}") from err


@contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No progress bars from `datasets` for instant local work (they would also precede a one-line error)."""
    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _pick_split(data: Dataset | DatasetDict, split: str, name: str) -> Dataset:
    if isinstance(data, Dataset):
        return data
    if split not in data:
        raise CLIError(f"dataset {name!r} has no split {split!r} (splits: {', '.join(data)})")
    return data[split]


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

    with _quiet_datasets():
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
    loaded = [load_prompt_dataset(script.dataset_name, script.dataset_config, split) for split in load]
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
            callbacks=[MetricsFileCallback(Path(config.output_dir) / METRICS_FILE)],
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


def grpo_command(argv: list[str]) -> int:
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


# ---------------------------------------------------------------------------------------------- plot command
def plot_command(argv: list[str]) -> int:
    parser = _ArgParser(
        prog=f"{PROG} plot",
        description=f"Re-draw RUN_DIR/training.png from RUN_DIR/{METRICS_FILE}.",
        allow_abbrev=False,
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="output_dir of a `replayrl grpo` run")
    parser.add_argument("--output", default=None, help="where to write the PNG (default: RUN_DIR/training.png)")
    args = parser.parse_args(argv)
    try:
        path = plot_run(args.run_dir, args.output)
    except FileNotFoundError as err:
        raise CLIError(str(err)) from err
    print(f"wrote {path}")
    return 0
