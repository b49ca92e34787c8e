"""`replayrl ppo [--config recipe.yaml] [--<field> value ...]`: PPO with a value head via `PPOTrainer.train()`.

Every `PPOConfig` field is a flag, plus the script arguments below. Values come from, lowest first: the CLI's
defaults (output_dir=runs/ppo-<time>); the built-in job's settings (`BUILTIN_CONFIG`, only without a model and
a dataset); the recipe file (--config); flags. Without a model and a dataset the built-in offline job runs: the
single-digit addition task of `replayrl.tasks.addition` (warmed-up tiny Qwen2 + a fresh value head, 0/1
exact-match reward), evaluated on its 20 held-out prompts before and after. Output: metrics.jsonl, training.png,
the final model (with its value head), a summary. Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from replayrl.cli.common import (
    PROG,
    CLIError,
    ModelArguments,
    finish_run,
    load_any_dataset,
    parse_command,
)
from replayrl.cli.common import ScriptArguments as DataArguments
from replayrl.cli.common import help_text as _help

# The built-in job (addition task): chosen by a short sweep of lr / batch / mini-batch (docs/ppo.md).
BUILTIN_CONFIG: dict[str, Any] = {
    "steps": 64 * 100,  # 100 PPO steps of 64 prompts (6,400 completions)
    "batch_size": 64,
    "mini_batch_size": 32,
    "learning_rate": 3e-4,  # 1e-3 with mini-batches of 16 rose, then collapsed onto wrong answers
    "init_kl_coef": 0.05,
    "adap_kl_ctrl": False,
    "logging_steps": 5,
}
BUILTIN_GENERATION = {"max_new_tokens": 4}
EVAL_SAMPLES = 8  # sampled answers per held-out prompt


@dataclass
class ScriptArguments(DataArguments):
    """The shared data flags, plus what PPO's loop needs: prompts, rewards, generation length, resuming."""

    _argument_group_name = "script arguments (data, rewards, generation)"

    prompt_column: str = field(default="prompt", metadata=_help("Column holding the prompts."))
    reward_funcs: list[str] | None = field(
        default=None,
        metadata=_help(
            "Reward specs: length, length:<n>, regex:<pattern>, exact_match, boxed, or package.module:function "
            "(required with --dataset_name)."
        ),
    )
    max_new_tokens: int | None = field(default=None, metadata=_help("Response length limit (default 32; built-in 4)."))
    max_prompt_length: int | None = field(default=None, metadata=_help("Keep the last N prompt tokens."))
    resume_from_checkpoint: str | None = field(
        default=None, metadata=_help("A checkpoint folder, or 'true' for the last complete one in output_dir.")
    )


def parse_ppo_args(argv: list[str]):
    """(ScriptArguments, ModelArguments, PPOConfig), resolved as the module docstring says."""
    from replayrl.ppo.config import PPOConfig

    epilog = (
        f"examples:\n  {PROG} ppo                          # built-in offline job, ~1 min of CPU time\n"
        f"  {PROG} ppo --model_name_or_path ./m --dataset_name d.jsonl --reward_funcs exact_match"
    )
    description = "Train with PPO and a value head (TRL v0.7.1's PPOTrainer API, managed loop)."
    types = (ScriptArguments, ModelArguments, PPOConfig)
    script, model_args, config = parse_command(
        "ppo", types, argv, BUILTIN_CONFIG, description=description, epilog=epilog
    )
    if script.dataset_test_split is not None:
        raise CLIError("replayrl ppo evaluates only the built-in job's held-out prompts: drop --dataset_test_split")
    if isinstance(config.log_with, str) and config.log_with.lower() == "none":
        config.log_with = None
    return script, model_args, config


def _job(script: ScriptArguments, model_args: ModelArguments, config):
    """(model, tokenizer, train dataset, held-out dataset or None, reward functions, generation kwargs)."""
    from replayrl.models.value_head import AutoModelForCausalLMWithValueHead
    from replayrl.rewards.builtin import get_reward
    from replayrl.tasks import addition

    generation = {} if script.max_new_tokens is None else {"max_new_tokens": script.max_new_tokens}
    if model_args.model_name_or_path is None and script.dataset_name is None:
        lm, tokenizer = addition.build_default_model(config.seed)
        train, held_out = addition.task_datasets(config.seed)
        model = AutoModelForCausalLMWithValueHead.from_pretrained(lm)
        return model, tokenizer, train, held_out, [addition.task_reward()], {**BUILTIN_GENERATION, **generation}
    if not script.reward_funcs:
        raise CLIError(
            "--reward_funcs is required with a model or dataset of your own, e.g. --reward_funcs exact_match"
        )
    try:
        rewards = [get_reward(spec) for spec in script.reward_funcs]
    except (ValueError, TypeError) as err:
        raise CLIError(f"bad --reward_funcs: {err}") from err
    if script.dataset_name is None:
        train, _ = addition.task_datasets(config.seed)
    else:
        train = load_any_dataset(script.dataset_name, script.dataset_config, script.dataset_train_split)
    if script.prompt_column not in train.column_names:
        raise CLIError(f"dataset has no column {script.prompt_column!r} (columns: {', '.join(train.column_names)})")
    return _load_model(model_args), _load_tokenizer(model_args), train, None, rewards, generation


def _load_model(model_args: ModelArguments):
    from replayrl.models.value_head import AutoModelForCausalLMWithValueHead
    from replayrl.tasks import addition

    if model_args.model_name_or_path is None:
        return AutoModelForCausalLMWithValueHead.from_pretrained(addition.build_default_model(0)[0])
    try:
        return AutoModelForCausalLMWithValueHead.from_pretrained(model_args.model_name_or_path)
    except (ValueError, OSError) as err:
        raise CLIError(str(err)) from err


def _load_tokenizer(model_args: ModelArguments):
    from transformers import AutoTokenizer

    from replayrl.models.tiny import build_tokenizer

    if model_args.model_name_or_path is None:
        return build_tokenizer()
    return AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left")


def run(argv: list[str]) -> int:
    from replayrl.ppo.loop import evaluate
    from replayrl.ppo.trainer import PPOTrainer
    from replayrl.tasks.addition import one_thread

    start = time.perf_counter()
    script, model_args, config = parse_ppo_args(argv)
    with one_thread():  # tiny models: one thread is faster (see replayrl.tasks.addition.one_thread)
        model, tokenizer, train, held_out, rewards, generation = _job(script, model_args, config)
        try:
            trainer = PPOTrainer(config, model, None, tokenizer, dataset=train)
        except ValueError as err:
            raise CLIError(str(err)) from err
        print(f"{PROG} ppo: {_describe(script, model_args)}; output_dir {config.output_dir}", flush=True)
        kwargs = {"generation_kwargs": generation, "max_prompt_length": script.max_prompt_length}
        evals = {}
        if held_out is not None:
            evals["before"] = evaluate(trainer, held_out, rewards, generation, num_samples=EVAL_SAMPLES)
        resume = script.resume_from_checkpoint
        resume = True if str(resume).lower() == "true" else resume
        trainer.train(rewards, prompt_column=script.prompt_column, resume_from_checkpoint=resume, **kwargs)
        if held_out is not None:
            evals["after"] = evaluate(trainer, held_out, rewards, generation, num_samples=EVAL_SAMPLES)
    if trainer.accelerator.is_main_process:
        extra = []
        if evals:
            extra.append(
                f"held-out reward ({EVAL_SAMPLES} samples per prompt): {evals['before']:.3f} before -> "
                f"{evals['after']:.3f} after"
            )
        from replayrl.metrics import summary_lines

        seconds, saved = time.perf_counter() - start, "final model + value head (AutoModelForCausalLMWithValueHead)"
        finish_run("ppo", config.output_dir, f"{trainer.current_step} PPO steps", seconds, summary_lines, extra, saved)
    return 0


def _describe(script: ScriptArguments, model_args: ModelArguments) -> str:
    if model_args.model_name_or_path is None and script.dataset_name is None:
        return "built-in job: single-digit addition, 0/1 exact-match reward, warmed-up tiny Qwen2 + value head"
    return (
        f"{model_args.model_name_or_path or 'the built-in tiny model'} on {script.dataset_name or 'the addition task'}"
    )
