"""The skeleton of every `replayrl` subcommand: shared flags (`ScriptArguments`, `ModelArguments`), one
`HfArgumentParser` (`make_parser`), flags < recipe < defaults resolution (`parse_with_recipe`), dataset loading,
and build-train-save-plot-summarise (`run_job`, `finish_run`). See `replayrl.cli` for how to add a subcommand.

Imports nothing heavy at module level: `replayrl --help`, `replayrl plot` and argument errors stay instant.
"""

from __future__ import annotations

import argparse
import re
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any

from replayrl.models.model_config import ModelArguments, ModelConfig, get_peft_config, model_init_kwargs

PROG = "replayrl"


# How every built-in job logs and evaluates (`eval_steps` is the job's own): log every 10 steps, evaluate from
# the start, keep no checkpoints (a built-in job is a short demonstration; pass --save_strategy to keep them).
def builtin_job_logging(eval_steps: int) -> dict[str, Any]:
    return dict(logging_steps=10, eval_strategy="steps", eval_steps=eval_steps, eval_on_start=True, save_strategy="no")


FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


class CLIError(Exception):
    """Bad user input: reported as one line on stderr, exit status 2."""


def help_text(text: str) -> dict:
    return {"help": text}


# ---------------------------------------------------------------------------------------------- shared flags
@dataclass
class ScriptArguments:
    """The recipe and data flags of every training command (TRL's `ScriptArguments` names). A command with more
    (prompt column, rewards, ...) subclasses it; the model's flags are `ModelArguments` or its subclass with
    TRL's loading and LoRA options, `ModelConfig` (both in `replayrl.models.model_config`)."""

    _argument_group_name = "script arguments (recipe, data)"

    config: str | None = field(
        default=None,
        metadata=help_text("Recipe YAML of flag values (keys = flag names); flags given here override it."),
    )
    dataset_name: str | None = field(
        default=None,
        metadata=help_text(
            "Hub dataset name, a folder written by save_to_disk, a data folder, or a .json/.jsonl/.csv/.parquet "
            "file (None: the built-in job's data)."
        ),
    )
    dataset_config: str | None = field(default=None, metadata=help_text("Dataset configuration name (e.g. 'main')."))
    dataset_train_split: str = field(
        default="train", metadata={**help_text("Split to train on."), "aliases": ["--dataset_split", "--dataset-split"]}
    )
    dataset_test_split: str | None = field(
        default=None,
        metadata=help_text("Split to evaluate on, with --eval_strategy steps|epoch (None: no evaluation)."),
    )


def model_loading(model_args: ModelConfig, config: Any):
    """Apply `ModelConfig`'s flags: its loading options (dtype, revision, attention, trust_remote_code) go under
    `config.model_init_kwargs` (the config's own keys win) when a model path is given; returns its LoRA settings as
    a `peft.LoraConfig`, or None without --use_peft, for the trainer's `peft_config`."""
    if model_args.model_name_or_path is not None:
        config.model_init_kwargs = {**model_init_kwargs(model_args), **(config.model_init_kwargs or {})}
    return get_peft_config(model_args)


def make_parser(command: str, types: Sequence[type], **kwargs: Any) -> argparse.ArgumentParser:
    """An `HfArgumentParser` over the dataclasses `types` whose errors are one-line `CLIError`s. A field of two
    dataclasses (`trust_remote_code`: `ModelConfig` and `GRPOConfig`) is one flag, owned by the first that has it;
    `parse_with_recipe` gives its value to both. `kwargs` go to argparse (description, epilog, ...)."""
    from transformers import HfArgumentParser

    class Parser(RaisingParserMixin, HfArgumentParser):
        pass

    owned, seen = [], set()
    for cls in types:
        names = {f.name for f in fields(cls) if f.init}
        owned.append(_without(cls, names & seen) if names & seen else cls)
        seen |= names
    kwargs.setdefault("usage", f"{PROG} {command} [-h] [--config RECIPE.yaml] [--<flag> VALUE ...]")
    parser = Parser(owned, prog=f"{PROG} {command}", formatter_class=HelpFormatter, allow_abbrev=False, **kwargs)
    parser.source_types = tuple(types)
    return parser


def _without(cls: type, names: set[str]) -> type:
    """A stand-in of dataclass `cls` for parsing, without the fields `names` (no __post_init__: `cls` runs it)."""
    hints = typing.get_type_hints(cls)
    spec = [
        (f.name, hints[f.name], field(default=f.default, default_factory=f.default_factory, metadata=f.metadata))
        for f in fields(cls)
        if f.init and f.name not in names
    ]
    group = {"_argument_group_name": cls._argument_group_name} if hasattr(cls, "_argument_group_name") else {}
    return make_dataclass(cls.__name__, spec, namespace=group)


def _rebuild(types: Sequence[type], parsed: list) -> list:
    """The parsed stand-ins as the real dataclasses, shared fields filled from their owner."""
    values: dict[str, Any] = {}
    out = []
    for cls, obj in zip(types, parsed):
        if type(obj) is not cls:
            own = {f.name for f in fields(obj)}
            obj = cls(
                **{f.name: getattr(obj, f.name) if f.name in own else values[f.name] for f in fields(cls) if f.init}
            )
        values.update({f.name: getattr(obj, f.name) for f in fields(cls)})
        out.append(obj)
    return out


class RaisingParserMixin:
    def error(self, message: str):
        # argparse would print the usage block and exit; one line (printed by main) is easier to read.
        raise CLIError(message)


class ArgParser(RaisingParserMixin, argparse.ArgumentParser):
    pass


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    def _format_action_invocation(self, action: argparse.Action) -> str:
        # Show `--flag_name VALUE` once; HfArgumentParser's `--flag-name` alias works too but doubles every line.
        if not action.option_strings:
            return super()._format_action_invocation(action)
        names = ", ".join(s for s in action.option_strings if "-" not in s.lstrip("-")) or action.option_strings[0]
        if action.nargs == 0:
            return names
        return f"{names} {self._format_args(action, self._get_default_metavar_for_optional(action))}"

    def _expand_help(self, action: argparse.Action) -> str:
        # argparse %-formats every help string; a bare "%" (transformers 5.2's "~20% slower" in TrainingArguments)
        # would make --help fail with "not enough arguments for format string".
        if action.help and re.search(r"(?<!%)%(?![(%])", action.help):
            action.help = re.sub(r"(?<!%)%(?![(%])", "%%", action.help)
        return super()._expand_help(action)


def one_line(text: str) -> str:
    return " ".join(text.split())


def load_recipe(path: str) -> dict[str, Any]:
    """A recipe YAML as {flag name: value}; dashes in keys read as underscores."""
    import yaml

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


def set_defaults(parser: argparse.ArgumentParser, values: dict[str, Any], source: str) -> None:
    """Make `values` the parser's defaults (so flags still override them), typed as if given as flags."""
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    converted = {}
    for key, value in values.items():
        if key not in actions:
            raise CLIError(f"{source}: unknown key {key!r}; keys are the command's flag names (see --help)")
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
def load_any_dataset(name: str, config_name: str | None, split: str):
    """One split of a hub dataset, a save_to_disk folder, a data folder or a single data file."""
    from datasets import load_dataset, load_from_disk

    path = Path(name).expanduser()
    builder = FILE_BUILDERS.get(path.suffix.lower())
    if builder and not path.is_file():
        raise CLIError(f"dataset file not found: {name}")
    try:
        if builder:  # one file is one split, whatever it is called
            with quiet_datasets():
                return load_dataset(builder, data_files={split: str(path)}, split=split)
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            return _pick_split(load_from_disk(str(path)), split, name)
        # hub datasets keep their progress bars: downloads can take a while
        with quiet_datasets() if path.is_dir() else nullcontext():
            return load_dataset(name, config_name, split=split)
    except CLIError:
        raise
    except Exception as err:  # loaders raise many types: DatasetNotFoundError, ConnectionError, ValueError, ...
        raise CLIError(f"could not load split {split!r} of dataset {name!r}: {err}") from err


@contextmanager
def quiet_datasets() -> Iterator[None]:
    """No progress bars from `datasets` for instant local work (they would also precede a one-line error)."""
    import datasets

    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _pick_split(data, split: str, name: str):
    from datasets import Dataset

    if isinstance(data, Dataset):
        return data
    if split not in data:
        raise CLIError(f"dataset {name!r} has no split {split!r} (splits: {', '.join(data)})")
    return data[split]


# ---------------------------------------------------------------------------------------------- early checks
TRACKER_MODULES = {
    "wandb": "wandb",
    "tensorboard": "tensorboard",
    "comet_ml": "comet_ml",
    "mlflow": "mlflow",
    "trackio": "trackio",
    "clearml": "clearml",
    "dvclive": "dvclive",
    "swanlab": "swanlab",
    "neptune": "neptune",
    "codecarbon": "codecarbon",
    "azure_ml": "azureml",
}


def check_trackers(report_to: list[str] | str | None) -> None:
    """Each tracker in --report_to must be importable: say which package to install now, not after loading."""
    import importlib.util

    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    for name in names:
        module = TRACKER_MODULES.get(name)
        if module and importlib.util.find_spec(module) is None:
            if name == "tensorboard" and importlib.util.find_spec("tensorboardX"):
                continue
            raise CLIError(f"--report_to {name} needs the {module} package: pip install {module} (or --report_to none)")


def check_resume(resume: str | None, output_dir: str, overwrite: bool) -> str | bool | None:
    """`--resume_from_checkpoint` (a path, or true for the last complete checkpoint) checked before loading
    anything; without it, an output_dir holding an earlier run's checkpoints is refused unless --overwrite."""
    from replayrl.checkpoints import CheckpointError, refuse_stale_checkpoints, resolve_resume

    value: str | bool | None = True if str(resume).lower() == "true" else resume
    try:
        resolve_resume(value, output_dir)
        if value in (None, False):
            refuse_stale_checkpoints(output_dir, overwrite, delete=False)
    except (CheckpointError, ValueError) as err:
        raise CLIError(str(err)) from err
    return value


# ---------------------------------------------------------------------------------------------- resolution
def parse_with_recipe(
    parser,
    argv: list[str],
    command: str,
    defaults: dict[str, Any],
    builtin: dict[str, Any],
    inputs: Sequence[str] = ("model_name_or_path", "dataset_name"),
):
    """The dataclasses of an HfArgumentParser `parser`, each value from the highest of: flags, the --config
    recipe, the built-in job's `builtin` settings (only when none of the `inputs` flags, a model and a dataset, is
    given in flags or recipe), the command's own `defaults`, the dataclass defaults. Any problem is a CLIError."""
    pre = ArgParser(add_help=False, allow_abbrev=False)
    for name in ("config", *inputs):
        pre.add_argument(f"--{name}", f"--{name.replace('_', '-')}", dest=name)
    known = pre.parse_known_args(argv)[0]
    recipe = load_recipe(known.config) if known.config else {}
    given = any((getattr(known, name) or recipe.get(name)) is not None for name in inputs)
    set_defaults(parser, {**defaults, **({} if given else builtin)}, "built-in defaults")
    set_defaults(parser, recipe, known.config)
    try:
        *parsed, remaining = parser.parse_args_into_dataclasses(
            argv, return_remaining_strings=True, look_for_args_file=False
        )
        if remaining:
            raise CLIError(f"unrecognized arguments: {' '.join(remaining)} (see `{PROG} {command} --help`)")
        return _rebuild(getattr(parser, "source_types", ()), parsed) if hasattr(parser, "source_types") else parsed
    except (ValueError, TypeError) as err:  # the config's own validation, with its fix-it message
        raise CLIError(str(err)) from err


def parse_command(command: str, types: Sequence[type], argv: list[str], builtin: dict[str, Any], **kwargs: Any) -> list:
    """`make_parser(command, types, **kwargs)` resolved by `parse_with_recipe` with the CLI's own defaults
    (output_dir=runs/<command>-<time>, report_to=none where the config has it) and the built-in job's settings."""
    parser = make_parser(command, types, **kwargs)
    defaults = {"output_dir": run_dir(command)}
    if any(f.name == "report_to" for cls in types for f in fields(cls)):
        defaults["report_to"] = "none"
    return parse_with_recipe(parser, argv, command, defaults, builtin)


def user_datasets(script: ScriptArguments, config: Any) -> tuple[Any, Any]:
    """(train, eval or None) from --dataset_name: the train split, and the test split when one is given."""
    evaluating = config.eval_strategy != "no" or config.eval_on_start
    if evaluating and not script.dataset_test_split:
        raise CLIError("evaluation is on (--eval_strategy / --eval_on_start) but no --dataset_test_split is given")
    train = load_any_dataset(script.dataset_name, script.dataset_config, script.dataset_train_split)
    test = script.dataset_test_split
    return train, load_any_dataset(script.dataset_name, script.dataset_config, test) if test else None


def run_dir(command: str) -> str:
    """The default output_dir of a command line run: runs/<command>-<time>."""
    return f"runs/{command}-{time.strftime('%Y%m%d-%H%M%S')}"


def builtin_job(script: ScriptArguments, model_args: ModelArguments) -> bool:
    """No model and no dataset given: the command runs its built-in offline job."""
    return model_args.model_name_or_path is None and script.dataset_name is None


# ---------------------------------------------------------------------------------------------- build and run
def run_job(
    command: str,
    config: Any,
    build: Callable[[], Any],
    describe: str,
    *,
    summary: Sequence[str] | Callable[[list[dict]], list[str]],
    tiny: bool = False,
    after: Callable[[Any], list[str]] | None = None,
    saved: str = "final model + tokenizer",
) -> int:
    """The run of a `transformers.Trainer`-based command: check --resume_from_checkpoint (before any loading),
    build the trainer (ValueError/OSError/ImportError -> CLIError), train, save the model to output_dir, then
    plot and print the summary (`finish_run`). `summary`: metric keys (first -> last log) or records -> lines;
    `tiny`: the built-in tiny model, trained on one torch thread; `after(trainer)`: extra summary lines (e.g. a
    held-out check) computed after training."""
    start = time.perf_counter()
    resume = check_resume(config.resume_from_checkpoint, config.output_dir, config.overwrite_output_dir)
    with _one_thread() if tiny else nullcontext():
        try:
            trainer = build()
        except (ValueError, OSError, ImportError) as err:  # bad format, missing model, no peft, ...
            raise CLIError(str(err)) from err
        print(f"{PROG} {command}: {describe}; output_dir {config.output_dir}", flush=True)
        trainer.train(resume_from_checkpoint=resume)
        trainer.save_model(config.output_dir)
        extra = after(trainer) if after is not None else []
    if trainer.is_world_process_zero():
        steps = f"{trainer.state.global_step} optimizer steps"
        finish_run(command, config.output_dir, steps, time.perf_counter() - start, summary, extra, saved)
    return 0


@contextmanager
def _one_thread() -> Iterator[None]:
    from replayrl.tasks.addition import one_thread

    with one_thread():
        yield


def finish_run(
    command: str,
    output_dir: str | Path,
    steps: str,
    seconds: float,
    summary: Sequence[str] | Callable[[list[dict]], list[str]],
    extra: Sequence[str] = (),
    saved: str | None = "final model + tokenizer",
) -> None:
    """The closing summary of a run: `summary` lines from its metrics.jsonl, `extra` lines, where the model,
    metrics, plot (drawn now, or skipped without matplotlib) and last checkpoint are."""
    from replayrl.metrics import METRICS_FILE, read_metrics

    out = Path(output_dir)
    records = read_metrics(out / METRICS_FILE) if (out / METRICS_FILE).is_file() else []
    lines = summary(records) if callable(summary) else first_last_lines(records, summary)
    print(f"\n{PROG} {command}: done, {steps} in {seconds:.0f} s wall time")
    for line in [*lines, *extra]:
        print(f"  {line}")
    if saved:
        print(f"  {saved}: {out}/")
    print(f"  metrics: {out / METRICS_FILE}\n  plot: {plot_or_skip(out)}")
    checkpoints = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    if checkpoints:
        print(f"  last checkpoint: {checkpoints[-1]}")


def first_last_lines(records: list[dict], keys: Sequence[str]) -> list[str]:
    """For each metric in `keys` (and its eval_ twin) the run logged: first logged value -> last."""
    from replayrl.metrics import series

    lines = []
    for name in [k for key in keys for k in (key, f"eval_{key}")]:
        steps, values = series(records, name)
        if values:
            lines.append(f"{name}: {values[0]:.3f} (step {steps[0]}) -> {values[-1]:.3f} (step {steps[-1]})")
    return lines


def plot_or_skip(run_dir: str | Path) -> str:
    """Draw RUN_DIR/training.png and say where it is; without matplotlib say the plot was skipped (the run and
    its metrics.jsonl are complete: `replayrl plot RUN_DIR` draws it later)."""
    from replayrl.metrics.plot import PlotUnavailable, plot_run

    try:
        return f"{plot_run(run_dir)}  (re-draw: {PROG} plot {run_dir})"
    except PlotUnavailable as err:
        return f"skipped: {err}"
