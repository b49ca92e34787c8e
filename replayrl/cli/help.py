"""Concise `--help` for commands with hundreds of flags (`replayrl grpo`): flags regrouped by topic."""

from __future__ import annotations

import argparse

COMMON_TRAINING_FLAGS = [
    "output_dir",
    "overwrite_output_dir",
    "resume_from_checkpoint",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_ratio",
    "weight_decay",
    "max_grad_norm",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "gradient_checkpointing",
    "bf16",
    "logging_steps",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "eval_strategy",
    "eval_steps",
    "eval_on_start",
    "per_device_eval_batch_size",
    "report_to",
    "seed",
]


def arrange_help(
    parser: argparse.ArgumentParser, sections: list[tuple[str, list[str]]], own: set[str], all_flags: bool
):
    """Regroup a parser's flags for `--help`: `sections` in order (title, flag names), then the command's own
    fields not listed ("other options"), then, only with `all_flags`, every other TrainingArguments flag.
    `--no_X` twins of boolean flags are never listed (`--X false` does the same)."""
    actions: dict[str, argparse.Action] = {}
    for action in parser._actions:
        negative = any(s.startswith(("--no_", "--no-")) for s in action.option_strings)
        if action.dest != "help" and not negative:
            actions.setdefault(action.dest, action)
    for group in parser._action_groups:
        group._group_actions[:] = [a for a in group._group_actions if a.dest == "help"]
    parser._action_groups[:] = [g for g in parser._action_groups if g._group_actions]
    placed: set[str] = set()
    for title, names in sections:
        _add_group(parser, title, [actions[n] for n in names if n in actions])
        placed.update(names)
    rest = [a for d, a in actions.items() if d not in placed]
    _add_group(parser, "other options", [a for a in rest if a.dest in own])
    others = [a for a in rest if a.dest not in own]
    if all_flags:
        _add_group(parser, "all other transformers.TrainingArguments flags", others)
    elif others:
        parser.epilog = (parser.epilog or "") + (
            f"\n\n{len(others)} more transformers.TrainingArguments flags are accepted: `{parser.prog} --help_all`."
        )


def _add_group(parser: argparse.ArgumentParser, title: str, actions: list[argparse.Action]) -> None:
    if actions:
        parser.add_argument_group(title)._group_actions.extend(actions)
