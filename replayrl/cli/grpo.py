"""`replayrl grpo [--config recipe.yaml] [--<field> value ...]`: train with GRPO + replay buffer, plot, summarise.

`replayrl grpo` takes every `GRPOWithReplayBufferConfig` field (so every `transformers.TrainingArguments` field
too) as a flag, plus the `ScriptArguments` below and TRL's `ModelConfig` flags (model loading, LoRA). `--help`
lists them by topic with the library's defaults; `--help_all` adds every TrainingArguments flag. Each value comes
from the highest of, lowest first:
  1. the CLI's own defaults: output_dir=runs/grpo-<time>, report_to=none;
  2. the built-in job's settings (`default_task.DEFAULT_CONFIG`), only when no model and no dataset are given;
  3. the recipe file given with --config (YAML: flag names without dashes as keys);
  4. flags on the command line.
Bad input (unknown flag or key, bad value, missing file, bad reward spec, invalid config) prints one line
`replayrl: error: ...` on stderr and exits with status 2; errors during training keep their traceback.
"""

from __future__ import annotations

import os
import sys
import textwrap
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from transformers import TrainingArguments

from replayrl.cli.common import (
    PROG,
    CLIError,
    check_trackers,
    load_any_dataset,
    make_parser,
    model_loading,
    parse_with_recipe,
    quiet_datasets,
    run_dir,
    run_job,
)
from replayrl.cli.common import ScriptArguments as DataArguments
from replayrl.cli.common import help_text as _help
from replayrl.cli.help import COMMON_TRAINING_FLAGS, arrange_help
from replayrl.grpo.config_parity import TRLParityArguments
from replayrl.metrics import summary_lines
from replayrl.models.model_config import ModelConfig
from replayrl.replay.config import GRPOWithReplayBufferConfig
from replayrl.rewards.builtin import RewardFunc, get_reward
from replayrl.tasks import addition as default_task
from replayrl.tasks import vlm_colours

if TYPE_CHECKING:  # the trainer, datasets and plotting are imported where used: `--help` stays light
    from datasets import Dataset

    from replayrl.replay.trainer import GRPOWithReplayBufferTrainer


@dataclass
class ScriptArguments(DataArguments):
    """What to train on and how to score it (TRL's ScriptArguments names); the model's flags are ModelConfig's."""

    _argument_group_name = "data and rewards"

    dataset_test_split: str = field(
        default="test", metadata=_help("Split to evaluate on; loaded only with --eval_strategy steps|epoch.")
    )
    prompt_column: str = field(default="prompt", metadata=_help("Column holding the prompts; renamed to 'prompt'."))
    system_prompt: str | None = field(
        default=None,
        metadata=_help("If set, each prompt becomes a chat: this system message, then the prompt as the user turn."),
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata=_help(
            "Rewards: length, length:<n>, regex:<pattern>, exact_match, boxed, module.function or module:function "
            "(the current directory is importable). Required with --dataset_name unless --reward_model_name_or_path."
        ),
    )
    reward_model_name_or_path: str | None = field(
        default=None, metadata=_help("A sequence-classification reward model (hub name or local folder), scored too.")
    )
    vlm: bool = field(
        default=False,
        metadata=_help(
            "Run the built-in vision-language job instead (a tiny Qwen2-VL reads a shape's colour, docs/vlm.md)."
        ),
    )


# ---------------------------------------------------------------------------------------------- arguments
def build_grpo_parser(all_flags: bool = False):
    builtin = ", ".join(f"{k}={v}" for k, v in default_task.DEFAULT_CONFIG.items())
    description = (
        "Train with GRPO and a replay buffer, then write checkpoints, the final model, metrics.jsonl and\n"
        "training.png to --output_dir and print a summary. Every value comes from, highest first: flags,\n"
        "the --config recipe, the built-in job's settings (only without a model and a dataset), the defaults\n"
        "shown below.\n\n" + textwrap.fill(f"The built-in job sets: {builtin}.", 100)
    )
    epilog = (
        "examples:\n"
        f"  {PROG} grpo                                            # built-in default job, offline, ~1 min on CPU\n"
        f"  {PROG} grpo --max_steps 100 --replay_buffer_size 0     # built-in job, shorter, without the buffer\n"
        f"  {PROG} grpo --vlm                                      # built-in vision-language job (docs/vlm.md)\n"
        f"  {PROG} grpo --config examples/qwen2_0.5b_math_boxed.yaml --learning_rate 2e-6\n"
        f"  {PROG} grpo --model_name_or_path ./my-model --dataset_name data.jsonl --prompt_column question \\\n"
        "      --reward_funcs boxed my_rewards.format --num_generations 8 --use_peft --lora_r 8\n\n"
        "current TRL's further GRPO options (loss types, entropy, tools, ...: docs/grpo.md) are listed by --help_all."
    )
    # `trust_remote_code` is a field of GRPOConfig and ModelConfig: one flag, owned by the config (listed first)
    parser = make_parser(
        "grpo",
        (ScriptArguments, GRPOWithReplayBufferConfig, ModelConfig),
        usage=f"{PROG} grpo [-h] [--help_all] [--config RECIPE.yaml] [--<flag> VALUE ...]",
        description=description,
        epilog=epilog,
    )
    own = {f.name for f in fields(GRPOWithReplayBufferConfig)} - {f.name for f in fields(TrainingArguments)}
    # current TRL's further GRPO options (docs/grpo.md) keep the concise help short: listed by --help_all
    model_flags = {f.name for f in fields(ModelConfig)}
    parity = [f.name for f in fields(TRLParityArguments) if f.name not in LOSS_FLAGS and f.name not in model_flags]
    # the asynchronous pipeline's tuning (docs/async.md): --async_generation is listed, its knobs by --help_all
    tuning = ["max_staleness", "weight_sync_steps", "max_inflight_tasks", "queue_maxsize"]
    # DeepSpeed ZeRO-3's generation setting (docs/distributed.md): by --help_all too
    sharded = ["ds3_gather_for_generation"]
    # the replay options that are not the default (docs/replay.md): by --help_all
    replay_options = ["replay_m2_threshold", "prompt_skipping", "prompt_skipping_explore"]
    replay_options += ["prompt_skipping_target_zero_std", "replay_zero_std_atol", "replay_max_reuse", "replay_score"]
    extra = [
        ("current-TRL GRPO options (docs/grpo.md)", parity),
        ("asynchronous generation", tuning),
        ("DeepSpeed ZeRO-3 (docs/distributed.md)", sharded),
        ("replay options (docs/replay.md)", replay_options),
    ]
    sections = _help_sections() + (extra if all_flags else [])
    hidden = set(parity) | set(tuning) | set(sharded) | set(replay_options)
    arrange_help(parser, sections, (own - hidden) | {"overwrite_output_dir"}, all_flags)
    return parser


def _help_sections() -> list[tuple[str, list[str]]]:
    script = [f.name for f in fields(ScriptArguments)]
    model = [f.name for f in fields(ModelConfig)]
    return [
        ("data and rewards", script + ["reward_weights"]),
        ("model (ModelConfig)", model + ["model_init_kwargs"]),
        ("generation", GENERATION_FLAGS),
        ("GRPO loss", LOSS_FLAGS),
        ("replay buffer", [f.name for f in REPLAY_FIELDS if f.name not in REPLAY_ALL_ONLY]),
        ("training (the most used transformers.TrainingArguments)", COMMON_TRAINING_FLAGS),
    ]


REPLAY_FIELDS = [f for f in fields(GRPOWithReplayBufferConfig) if f.name.startswith("replay_")]
REPLAY_ALL_ONLY = {"replay_m2_threshold", "replay_zero_std_atol", "replay_max_reuse", "replay_score"}  # by --help_all
GENERATION_FLAGS = [
    "num_generations",
    "max_prompt_length",
    "max_completion_length",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "generation_batch_size",
    "steps_per_generation",
    "use_vllm",
]
LOSS_FLAGS = [
    "loss_type",
    "beta",
    "epsilon",
    "epsilon_high",
    "num_iterations",
    "scale_rewards",
    "importance_sampling_level",
    "mask_truncated_completions",
    "sync_ref_model",
]


def parse_grpo_args(argv: list[str]) -> tuple[ScriptArguments, ModelConfig, GRPOWithReplayBufferConfig]:
    """Resolve flags, recipe and defaults (see the module docstring) into the two dataclasses."""
    if "--help_all" in argv:
        build_grpo_parser(all_flags=True).print_help()
        raise SystemExit(0)
    parser = build_grpo_parser()
    if "-h" in argv or "--help" in argv:
        parser.print_help()  # the library's defaults, not the built-in job's
        raise SystemExit(0)
    defaults = {"output_dir": run_dir("grpo"), "report_to": "none"}
    job = vlm_colours if _wants_vlm(argv) else default_task
    script, config, model_args = parse_with_recipe(parser, argv, "grpo", defaults, job.DEFAULT_CONFIG)
    check_trackers(config.report_to)
    if script.vlm and (script.dataset_name or model_args.model_name_or_path):
        raise CLIError("--vlm runs the built-in vision-language job: drop --dataset_name and --model_name_or_path")
    return script, model_args, config


def _wants_vlm(argv: list[str]) -> bool:
    """Whether the command line asks for the built-in VLM job (`--vlm`, `--vlm true`), before parsing: its settings
    are the defaults the parser fills in."""
    if "--vlm" not in argv:
        return any(a.lower() in ("--vlm=true", "--vlm=1") for a in argv)
    following = argv[argv.index("--vlm") + 1 : argv.index("--vlm") + 2]
    return not following or following[0].lower() not in ("false", "0", "no")


def _task(script: ScriptArguments):
    """The built-in job's module: the VLM one with --vlm, else the addition task."""
    return vlm_colours if script.vlm else default_task


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


def resolve_rewards(
    specs: list[str] | None, reward_model: str | None, builtin_task: bool, task=default_task
) -> list[RewardFunc | str]:
    """Reward functions from their specs (the current directory importable, as for TRL's CLI), plus the reward
    model's path, which the trainer loads; without either, the built-in `task`'s reward."""
    extra = [reward_model] if reward_model else []
    if not specs:
        if builtin_task and not extra:
            return [task.task_reward()]
        if extra:
            return extra
        raise CLIError(
            "--reward_funcs is required with --dataset_name, e.g. --reward_funcs exact_match (builtins: length, "
            "length:<n>, regex:<pattern>, exact_match, boxed; or my_module.my_function), or give "
            "--reward_model_name_or_path"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return [get_reward(spec) for spec in specs] + extra
    except (ValueError, TypeError) as err:
        raise CLIError(f"bad --reward_funcs: {err}") from err


def _datasets(script: ScriptArguments, config: GRPOWithReplayBufferConfig) -> tuple[Dataset, Dataset | None]:
    """(train, eval or None). The built-in task evaluates on its held-out prompts."""
    evaluating = config.eval_strategy != "no" or config.eval_on_start
    if script.dataset_name is None:
        train, held_out = _task(script).task_datasets(config.seed)
        return train, held_out if evaluating else None
    load = [script.dataset_train_split] + ([script.dataset_test_split] if evaluating else [])
    loaded = [load_any_dataset(script.dataset_name, script.dataset_config, split) for split in load]
    prepared = [prepare_prompts(ds, script.prompt_column, script.system_prompt) for ds in loaded]
    return prepared[0], prepared[1] if len(prepared) > 1 else None


# ---------------------------------------------------------------------------------------------- grpo command
def build_trainer(
    script: ScriptArguments,
    model_args: ModelConfig,
    config: GRPOWithReplayBufferConfig,
    trainer_cls: type | None = None,
) -> GRPOWithReplayBufferTrainer:
    """Datasets, rewards, model and trainer (`trainer_cls`, default GRPOWithReplayBufferTrainer; `replayrl rloo`
    passes RLOOTrainer, built on the same rollout); any problem with them is a CLIError."""
    from replayrl.replay.trainer import GRPOWithReplayBufferTrainer

    trainer_cls = trainer_cls or GRPOWithReplayBufferTrainer
    builtin_task = script.dataset_name is None
    rewards = resolve_rewards(script.reward_funcs, script.reward_model_name_or_path, builtin_task, _task(script))
    train, evaluation = _datasets(script, config)
    try:
        if model_args.model_name_or_path is None:
            model, tokenizer = _task(script).build_default_model(config.seed)
        else:
            model, tokenizer = model_args.model_name_or_path, None
        peft_config = model_loading(model_args, config)
        return trainer_cls(
            model=model,
            reward_funcs=rewards,
            args=config,
            train_dataset=train,
            eval_dataset=evaluation,
            processing_class=tokenizer,
            peft_config=peft_config,
        )
    except (ValueError, OSError, ImportError) as err:  # model not found, reward_weights mismatch, no peft, ...
        raise CLIError(str(err)) from err


def _describe(script: ScriptArguments, model_args: ModelConfig, config: GRPOWithReplayBufferConfig) -> str:
    if script.vlm:
        job = f"built-in VLM job: {vlm_colours.TASK_DESCRIPTION} (replayrl/tasks/vlm_colours.py)"
    elif model_args.model_name_or_path is None and script.dataset_name is None:
        job = f"built-in default job: {default_task.TASK_DESCRIPTION} (replayrl/tasks/addition.py)"
    else:
        model = model_args.model_name_or_path or "the built-in tiny model"
        job = f"{model} on {script.dataset_name or 'the built-in addition task'}"
    buffer = f"replay buffer {config.replay_buffer_size} groups" if config.replay_buffer_size else "no replay buffer"
    return f"{job}; {buffer}"


def run(argv: list[str]) -> int:
    script, model_args, config = parse_grpo_args(argv)
    tiny = model_args.model_name_or_path is None  # the built-in model: one torch thread is faster
    job = _describe(script, model_args, config)
    build = lambda: build_trainer(script, model_args, config)  # noqa: E731
    return run_job("grpo", config, build, job, summary=summary_lines, tiny=tiny)
