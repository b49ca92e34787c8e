"""`replayrl sft [--config recipe.yaml] [--<field> value ...]`: supervised fine-tuning, plot, summary.

`replayrl sft` takes every `SFTConfig` field (so every `transformers.TrainingArguments` field too) as a flag,
plus the `ScriptArguments` below (TRL's names). Each value comes from the highest of, lowest first:
  1. the CLI's own defaults: output_dir=runs/sft-<time>, report_to=none;
  2. the built-in job's settings (`DEFAULT_CONFIG`), only when no model and no dataset are given;
  3. the recipe file given with --config (YAML: flag names without dashes as keys);
  4. flags on the command line.

The built-in job (no model, no dataset): a randomly initialised tiny Qwen2 (the addition task's model,
`replayrl.tasks.addition`) learns single-digit addition from prompt-completion pairs ("3+4=" -> "7"): 80 pairs
to train on, 20 held out; completion-only loss. It finishes in well under a minute on one CPU core and reports
loss and token accuracy (train and held-out) and how many held-out sums it answers exactly (greedy decoding).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import HfArgumentParser

from replayrl.cli.common import (
    PROG,
    CLIError,
    HelpFormatter,
    RaisingParserMixin,
    load_any_dataset,
    parse_with_recipe,
    quiet_datasets,
    run_dir,
)
from replayrl.cli.common import help_text as _help
from replayrl.metrics import METRICS_FILE, read_metrics, series
from replayrl.metrics.plot import plot_run
from replayrl.sft import SFTConfig, SFTTrainer
from replayrl.tasks import addition as task

JOB_DESCRIPTION = "SFT of a random tiny Qwen2 on single-digit addition (80 prompt-completion pairs, 20 held out)"
DEFAULT_CONFIG: dict[str, Any] = {
    "learning_rate": 3e-3,  # a 130k-parameter model from scratch; TRL's 2e-5 is for pretrained models
    "lr_scheduler_type": "constant",
    "max_steps": 200,  # held-out loss rises again after ~250 steps (80 training pairs)
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 20,
    "max_length": 16,
    "logging_steps": 10,
    "eval_strategy": "steps",
    "eval_steps": 50,
    "eval_on_start": True,
    "save_strategy": "no",
    "dataloader_pin_memory": False,  # CPU job: avoids torch's pin_memory warning
}


@dataclass
class ScriptArguments:
    """What to train; the training settings are the config's flags."""

    _argument_group_name = "script arguments (model, data)"

    config: str | None = field(
        default=None, metadata=_help("Recipe YAML of flag values (keys = flag names); flags given here override it.")
    )
    model_name_or_path: str | None = field(
        default=None, metadata=_help("Model to train: a hub name or a save_pretrained folder (None: built-in job).")
    )
    dataset_name: str | None = field(
        default=None,
        metadata=_help(
            "Hub dataset, save_to_disk folder, data folder or .json/.jsonl/.csv/.parquet file with 'text', "
            "'messages' or 'prompt'+'completion' columns (None: the built-in addition task)."
        ),
    )
    dataset_config: str | None = field(default=None, metadata=_help("Dataset configuration name."))
    dataset_train_split: str = field(default="train", metadata=_help("Split to train on."))
    dataset_test_split: str | None = field(
        default=None, metadata=_help("Split to evaluate on, with --eval_strategy steps|epoch (None: no evaluation).")
    )


class _SFTParser(RaisingParserMixin, HfArgumentParser):
    pass


def build_sft_parser() -> _SFTParser:
    parser = _SFTParser(
        (ScriptArguments, SFTConfig),
        prog=f"{PROG} sft",
        usage=f"{PROG} sft [-h] [--config RECIPE.yaml] [--<flag> VALUE ...]",
        description="Supervised fine-tuning; writes the model, metrics.jsonl and training.png to --output_dir.",
        epilog=(
            "examples:\n"
            f"  {PROG} sft                                  # built-in offline job, < 1 min on CPU\n"
            f"  {PROG} sft --model_name_or_path ./my-model --dataset_name data.jsonl --packing true"
        ),
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    training = parser.add_argument_group("training arguments (SFTConfig, incl. TrainingArguments)")
    moved = [a for a in parser._optionals._group_actions if a.dest != "help"]
    parser._optionals._group_actions[:] = [a for a in parser._optionals._group_actions if a.dest == "help"]
    training._group_actions.extend(moved)
    return parser


def parse_sft_args(argv: list[str]) -> tuple[ScriptArguments, SFTConfig]:
    parser = build_sft_parser()
    defaults = {"output_dir": run_dir("sft"), "report_to": "none"}
    script, config = parse_with_recipe(parser, argv, "sft", defaults, DEFAULT_CONFIG)
    return script, config


def builtin_datasets(seed: int) -> tuple[Dataset, Dataset]:
    """(train, held-out) prompt-completion pairs of the addition task."""
    train, held_out = task.task_datasets(seed)
    return train.rename_column("answer", "completion"), held_out.rename_column("answer", "completion")


def _datasets(script: ScriptArguments, config: SFTConfig) -> tuple[Dataset, Dataset | None]:
    evaluating = config.eval_strategy != "no" or config.eval_on_start
    if script.dataset_name is None:
        train, held_out = builtin_datasets(config.seed)
        return train, held_out if evaluating else None
    if evaluating and not script.dataset_test_split:
        raise CLIError("evaluation is on (--eval_strategy / --eval_on_start) but no --dataset_test_split is given")
    train = load_any_dataset(script.dataset_name, script.dataset_config, script.dataset_train_split)
    test = script.dataset_test_split
    return train, load_any_dataset(script.dataset_name, script.dataset_config, test) if test else None


def build_trainer(script: ScriptArguments, config: SFTConfig) -> SFTTrainer:
    train, evaluation = _datasets(script, config)
    if script.model_name_or_path is None:
        from replayrl.models.tiny import build_tiny_model, build_tokenizer

        tokenizer = build_tokenizer()
        model = build_tiny_model(tokenizer, seed=config.seed, **task.MODEL_KWARGS)
        model.config._name_or_path = "replayrl-tiny-adder"
    else:
        model, tokenizer = script.model_name_or_path, None
    try:
        return SFTTrainer(model, args=config, train_dataset=train, eval_dataset=evaluation, processing_class=tokenizer)
    except (ValueError, OSError) as err:  # bad format, missing model, template without generation marks, ...
        raise CLIError(str(err)) from err


def run(argv: list[str]) -> int:
    start = time.perf_counter()
    script, config = parse_sft_args(argv)
    builtin = script.model_name_or_path is None
    with task.one_thread() if builtin else nullcontext():
        with quiet_datasets() if script.dataset_name is None else nullcontext():
            trainer = build_trainer(script, config)
        job = JOB_DESCRIPTION if builtin else f"{script.model_name_or_path} on {script.dataset_name}"
        print(f"{PROG} sft: {job}; output_dir {config.output_dir}", flush=True)
        resume = config.resume_from_checkpoint  # "true": the last checkpoint in output_dir, as Trainer.train(True)
        trainer.train(resume_from_checkpoint=True if str(resume).lower() == "true" else resume)
        trainer.save_model(config.output_dir)
        exact = held_out_exact(trainer, config.seed) if builtin and script.dataset_name is None else None
    if trainer.is_world_process_zero():
        plot = plot_run(config.output_dir)
        print_summary(config, trainer.state.global_step, time.perf_counter() - start, plot, exact)
    return 0


def held_out_exact(trainer: SFTTrainer, seed: int) -> tuple[int, int]:
    """(held-out prompts whose greedy answer is exactly the sum, number of held-out prompts)."""
    import torch

    _, held_out = builtin_datasets(seed)
    tokenizer, model = trainer.processing_class, trainer.model.eval()
    ids = torch.tensor([tokenizer(p).input_ids for p in held_out["prompt"]], device=model.device)  # all 4 chars
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
    answers = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
    return sum(a.strip() == c for a, c in zip(answers, held_out["completion"])), len(answers)


def summary_lines(records: list[dict]) -> list[str]:
    lines = []
    for key in ("loss", "mean_token_accuracy", "eval_loss", "eval_mean_token_accuracy"):
        steps, values = series(records, key)
        if values:
            lines.append(f"{key}: {values[0]:.3f} (step {steps[0]}) -> {values[-1]:.3f} (step {steps[-1]})")
    return lines


def print_summary(config: SFTConfig, steps: int, seconds: float, plot: Path, exact: tuple[int, int] | None) -> None:
    out = Path(config.output_dir)
    print(f"\n{PROG} sft: done, {steps} optimizer steps in {seconds:.0f} s wall time")
    for line in summary_lines(read_metrics(out / METRICS_FILE)):
        print(f"  {line}")
    if exact is not None:
        print(f"  held-out sums answered exactly (greedy): {exact[0]}/{exact[1]}")
    print(f"  final model + tokenizer: {out}/")
    print(f"  metrics: {out / METRICS_FILE}")
    print(f"  plot: {plot}  (re-draw: {PROG} plot {out})")
