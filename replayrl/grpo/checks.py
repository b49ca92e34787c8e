"""Checks on what a GRPO trainer is given, run at construction: every problem that would otherwise surface
mid-training (or train 0 steps in silence) is a `ValueError` naming the value and the fix."""

from __future__ import annotations

from typing import Any

from replayrl.grpo.streaming import prepare_streaming_datasets


def check_datasets(args, train_dataset, eval_dataset, reward_funcs, needs_prompt=True, dataset_columns=True) -> None:
    """Train and eval datasets against the config and the columns the reward functions read. `needs_prompt=False`
    (environments, which may supply the prompt from `reset()`): a `prompt` column is optional.
    `dataset_columns=False` (a rollout_func, whose extra fields join the columns at run time): the columns the
    reward functions read are not checked against the datasets."""
    if not dataset_columns:
        reward_funcs = _NoColumns()
    if isinstance(train_dataset, dict):  # DatasetDict, IterableDatasetDict
        raise TypeError(
            f"`train_dataset` must be a `Dataset` or `IterableDataset`, got `{type(train_dataset).__name__}`: pick "
            "a split, e.g. train_dataset=dataset['train']."
        )
    prepare_streaming_datasets(args, train_dataset, eval_dataset)
    if train_dataset is None:  # only a subclass's own checks get here (GRPOTrainer refuses it, as TRL 1.16)
        return _check_eval(args, eval_dataset, reward_funcs, set(), needs_prompt)
    _check_prompts("train_dataset", train_dataset, needs_prompt)
    _check_required_columns("train_dataset", train_dataset, reward_funcs.columns_required())
    needed = args.generation_batch_size // args.num_generations
    if hasattr(train_dataset, "__len__") and len(train_dataset) < needed:
        raise ValueError(
            f"train_dataset has {len(train_dataset)} prompts but one generation batch needs {needed} distinct "
            f"prompts (generation_batch_size {args.generation_batch_size} / num_generations "
            f"{args.num_generations}), so training would run 0 steps. Add prompts, or lower "
            "per_device_train_batch_size / steps_per_generation / gradient_accumulation_steps."
        )
    _check_eval(args, eval_dataset, reward_funcs, set(_columns(train_dataset) or ()), needs_prompt)


def _check_eval(args, eval_dataset, reward_funcs, train_columns: set[str], needs_prompt: bool = True) -> None:
    if eval_dataset is None:
        return
    check_eval_batch(args)
    reward_columns = reward_funcs.columns_used()
    for name, ds in _named(eval_dataset):
        _check_prompts(name, ds, needs_prompt)
        _check_required_columns(name, ds, reward_funcs.columns_required())
        missing = sorted(reward_columns & train_columns - set(_columns(ds) or reward_columns))
        if missing:
            raise ValueError(
                f"{name} lacks the column(s) {missing} that the reward functions read (train_dataset has them); "
                "evaluation would fail at its first batch. Add them to the eval dataset."
            )


def check_eval_batch(args) -> None:
    """Each process evaluates whole groups: per_device_eval_batch_size a multiple of the eval group size."""
    group = args.num_generations_eval or args.num_generations
    if args.per_device_eval_batch_size % group != 0:
        fit = max(group, args.per_device_eval_batch_size // group * group)
        raise ValueError(
            f"per_device_eval_batch_size ({args.per_device_eval_batch_size}) must be a multiple of "
            f"{'num_generations_eval' if args.num_generations_eval else 'num_generations'} ({group}) so that each "
            f"process evaluates whole groups; set per_device_eval_batch_size={fit}, or another multiple of {group}."
        )


def _check_required_columns(name: str, dataset, required: dict[str, set[str]]) -> None:
    columns = _columns(dataset)
    if columns is None:
        return
    for func, needed in required.items():
        missing = sorted(needed - set(columns))
        if missing:
            raise ValueError(
                f"Reward function {func!r} needs the column(s) {missing}, which {name} lacks (columns: {columns}). "
                "Add them, or rename yours (e.g. dataset.rename_column('solution', 'answer'))."
            )


class _NoColumns:
    """Reward functions that read no dataset column (their columns come from elsewhere)."""

    def columns_used(self) -> set[str]:
        return set()

    def columns_required(self) -> dict[str, set[str]]:
        return {}


def check_images(args, processing_class, tools, environment_factory, rollout_func) -> None:
    """A dataset with an image column: what replayrl trains a vision-language model with (docs/vlm.md)."""
    if not hasattr(processing_class, "image_processor"):
        raise ValueError(
            f"the dataset has an 'image'/'images' column but processing_class is a {type(processing_class).__name__}, "
            "not a processor that handles images: pass the model's processor (AutoProcessor.from_pretrained(...))."
        )
    backend = "use_vllm=True" if args.use_vllm else "use_transformers_continuous_batching=True"
    if args.use_vllm or getattr(args, "use_transformers_continuous_batching", False):
        raise ValueError(
            f"{backend} with images is not supported by replayrl yet: generation with images runs through "
            "transformers' generate(). Set use_vllm=False (and use_transformers_continuous_batching=False)."
        )
    if getattr(args, "async_generation", False):
        raise ValueError(
            "async_generation=True with images is not supported by replayrl yet (the worker process samples text "
            "prompts only); set async_generation=False."
        )
    for given, name in ((tools, "tools"), (environment_factory, "environment_factory"), (rollout_func, "rollout_func")):
        if given:
            raise ValueError(f"{name} with an image dataset is not supported by replayrl yet: drop {name}.")


def named_datasets(dataset) -> list[tuple[str, Any]]:
    """[(name, dataset)] of an eval dataset (a dict of them, one, or none)."""
    return [] if dataset is None else _named(dataset)


def _named(dataset) -> list[tuple[str, Any]]:
    if isinstance(dataset, dict):
        return [(f"eval_dataset[{key!r}]", ds) for key, ds in dataset.items()]
    return [("eval_dataset", dataset)]


def _columns(dataset) -> list[str] | None:
    return getattr(dataset, "column_names", None)


def _check_prompts(name: str, dataset, needs_prompt: bool = True) -> None:
    columns = _columns(dataset)
    if columns is not None and "prompt" not in columns:
        if not needs_prompt:
            return
        raise ValueError(
            f"{name} has no 'prompt' column (columns: {columns}). GRPO reads prompts from 'prompt': rename "
            "your column, e.g. dataset.rename_column('question', 'prompt')."
        )
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        raise ValueError(f"{name} is empty: it has no prompts to generate from.")
    if columns is None or not hasattr(dataset, "__len__"):
        return  # streaming datasets: prompts are checked batch by batch (check_prompt_batch)
    check_prompt_batch(dataset["prompt"], name)


def check_prompt_batch(prompts: list, where: str) -> None:
    """Empty prompts would crash inside `generate`: name the first one instead."""
    for i, prompt in enumerate(prompts):
        empty = not prompt.strip() if isinstance(prompt, str) else not prompt
        if empty:
            raise ValueError(
                f"{where} has an empty prompt at row {i} ({prompt!r}); generation needs at least one token. "
                "Drop such rows, e.g. dataset.filter(lambda row: len(row['prompt']) > 0)."
            )
