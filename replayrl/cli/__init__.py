"""The `replayrl` command line (also `python -m replayrl`): one module per subcommand, imported on use.

    replayrl grpo [--config recipe.yaml] [--<flag> value ...]   GRPO + replay buffer (built-in job without a model)
    replayrl plot RUN_DIR                                        re-draw a run's plot from its metrics.jsonl
    replayrl verify CHECKPOINT                                   check a checkpoint's files against their checksums
    replayrl env                                                 print the versions and the device (for a bug report)

Each subcommand module has `run(argv) -> int`. Bad input raises `CLIError`: one line on stderr, exit status 2.
This module imports nothing heavy, so `replayrl --help` and a mistyped command answer at once.

Adding a subcommand (a trainer `replayrl foo`): one module `replayrl/cli/foo.py` and one line in `COMMANDS`.
The module uses the skeleton in `replayrl.cli.common`:

    from replayrl.cli.common import ModelArguments, ScriptArguments, parse_command, run_job, user_datasets

    DEFAULT_CONFIG = {"max_steps": 50, "learning_rate": 1e-3}  # the built-in job's settings (no model, no dataset)

    def run(argv: list[str]) -> int:
        script, model_args, config = parse_command(
            "foo", (ScriptArguments, ModelArguments, FooConfig), argv, DEFAULT_CONFIG, description="Train with Foo."
        )
        def build():  # datasets first (their errors before any model loading), then model and trainer
            builtin = script.dataset_name is None
            train, evaluation = builtin_data(config.seed) if builtin else user_datasets(script, config)
            model = model_args.model_name_or_path or build_tiny_model(config.seed)
            return FooTrainer(model, args=config, train_dataset=train, eval_dataset=evaluation)
        return run_job("foo", config, build, "what runs", summary=("loss",), tiny=model_args.model_name_or_path is None)

`parse_command` puts every field of the dataclasses on one `HfArgumentParser` (flags < --config recipe < the
built-in job's settings < defaults; output_dir=runs/foo-<time>, report_to=none); a command needing more data flags
subclasses `ScriptArguments`, one with model loading and LoRA flags uses `replayrl.models.model_config.ModelConfig`
instead of `ModelArguments`. `run_job` checks --resume_from_checkpoint, builds (ValueError/OSError -> one-line
error), trains, saves, writes training.png (skipped with a note without the `plot` extra) and prints the summary.
The module may import its trainer at the top: it is imported only when its command runs.
"""

from __future__ import annotations

import importlib
import sys

from replayrl.cli.common import PROG, CLIError, one_line
from replayrl.distributed import end_distributed

# name -> (module, one-line description); a new trainer adds its line here.
COMMANDS: dict[str, tuple[str, str]] = {  # the post-training pipeline in order, then the tools
    "grpo": ("replayrl.cli.grpo", "train with GRPO and a replay buffer (built-in offline job without a model)"),
    "sft": ("replayrl.cli.sft", "supervised fine-tuning (built-in offline job without a model)"),
    "reward": ("replayrl.cli.reward", "train a reward model on preferences (built-in offline job without a model)"),
    "dpo": ("replayrl.cli.dpo", "train with DPO and its loss variants (built-in offline job without a model)"),
    "distillation": ("replayrl.cli.distillation", "on-policy distillation from a teacher (built-in offline job)"),
    "kto": (
        "replayrl.cli.kto",
        "train with KTO on unpaired good/bad completions (built-in offline job without a model)",
    ),
    "rloo": ("replayrl.cli.rloo", "train with RLOO, REINFORCE leave-one-out (built-in offline job without a model)"),
    "ppo": ("replayrl.cli.ppo", "train with PPO and a value head (built-in offline job without a model)"),
    "ddpo": ("replayrl.cli.ddpo", "fine-tune a diffusion model with DDPO (built-in offline job without a model)"),
    "vllm-serve": ("replayrl.cli.vllm_serve", "serve a model with vLLM for GRPO's vllm_mode='server' (loopback)"),
    "plot": ("replayrl.cli.plot", "re-draw a run's plot from its metrics.jsonl"),
    "verify": ("replayrl.cli.verify", "check a checkpoint's files against the checksums its save recorded"),
    "env": ("replayrl.cli.env", "print the versions and the device, one line each, for a bug report"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return (
        f"usage: {PROG} <command> [options]\n\ncommands:\n"
        + "\n".join(lines)
        + f"\n\n`{PROG} <command> --help` lists a command's options; `{PROG} --version` prints the version."
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `replayrl` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        status = _dispatch(argv)
        end_distributed()  # under `accelerate launch`: see replayrl/distributed.py
        return status
    except CLIError as err:
        print(f"{PROG}: error: {one_line(str(err))}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # argparse's --help
        return exit_.code if isinstance(exit_.code, int) else 0


def _dispatch(argv: list[str]) -> int:
    names = ", ".join(COMMANDS)
    if not argv:
        raise CLIError(f"missing command: one of {names} (see `{PROG} --help`)")
    command, rest = argv[0], argv[1:]
    if command in ("-h", "--help"):
        print(usage())
        return 0
    if command == "--version":
        from replayrl import __version__

        print(f"{PROG} {__version__}")
        return 0
    if command not in COMMANDS:
        raise CLIError(f"unknown command {command!r}: expected one of {names} (see `{PROG} --help`)")
    return importlib.import_module(COMMANDS[command][0]).run(rest)
