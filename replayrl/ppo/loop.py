"""`PPOTrainer.train()`: TRL v0.7.1's PPO loop run for the user, with GRPO's reward functions, and checkpoints.

Per step (``config.total_ppo_epochs = ceil(config.steps / config.batch_size)`` steps): take the next
``batch_size`` rows of the dataset (a fresh seeded permutation per epoch, so the order depends only on the step
and resumes exactly), render prompts (chat template for conversational ones), left-pad, sample one response each
with transformers ``generate`` (`replayrl.generation.hf`), score with `RewardFunctions` (TRL's convention:
``prompts``, ``completions``, ``completion_ids``, one list per extra column; weighted sum; a sample no function
scored gets 0), then `PPOTrainer.step` and `log_stats`.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import GenerationConfig

from replayrl.data.prompts import is_conversational, prompts_to_text, tokenize_prompts
from replayrl.generation.hf import generate_completions
from replayrl.model_card import write_card_for_run
from replayrl.ppo.checkpoint import load_checkpoint, save_checkpoint, save_model
from replayrl.rewards.functions import RewardFunctions


def train(
    trainer,
    reward_funcs,
    reward_weights: list[float] | None = None,
    reward_processing_classes=None,
    generation_kwargs: dict | None = None,
    max_prompt_length: int | None = None,
    prompt_column: str = "prompt",
    resume_from_checkpoint: str | bool | None = None,
) -> dict:
    """Run ``config.total_ppo_epochs`` PPO steps on ``trainer.dataset``; returns the last step's stats.

    ``generation_kwargs`` override the sampling defaults (``max_new_tokens=32``, ``do_sample=True``, ``top_k=0``,
    ``top_p=1.0``, ``temperature=config.temperature``). Checkpoints every ``config.save_steps`` steps into
    ``config.output_dir``; ``resume_from_checkpoint`` is a checkpoint path or True (the last complete one).
    """
    from replayrl.checkpoints import refuse_stale_checkpoints, resolve_resume

    config, dataset = trainer.config, trainer.dataset
    _check_dataset(trainer, dataset, prompt_column)
    if resume_from_checkpoint not in (None, False) and not config.output_dir:
        raise ValueError("resume_from_checkpoint needs config.output_dir (where the checkpoints are).")
    funcs = RewardFunctions(reward_funcs, reward_processing_classes, reward_weights)
    generation_config = _generation_config(trainer, generation_kwargs or {})
    start = 0
    checkpoint = resolve_resume(resume_from_checkpoint, config.output_dir) if config.output_dir else None
    if checkpoint is not None:
        start = load_checkpoint(trainer, checkpoint)
        trainer.metrics_file.start(start)  # drop lines logged after the checkpoint: they are logged again
    elif config.output_dir:
        refuse_stale_checkpoints(config.output_dir, overwrite_hint=None)
    stats: dict = {}
    total = config.total_ppo_epochs
    for step in range(start, total):
        rows = dataset.select(_rows_for_step(trainer, len(dataset), step))[:]
        stats, scores, completions = _one_step(
            trainer, rows, funcs, generation_config, max_prompt_length, prompt_column, step
        )
        if (step + 1) % config.logging_steps == 0 or step + 1 == total:
            trainer.log_stats(stats, {"query": rows[prompt_column], "response": completions}, scores)
        if config.save_steps and config.output_dir and (step + 1) % config.save_steps == 0:
            save_checkpoint(trainer, config.output_dir, step + 1)
    if config.output_dir:
        save_model(trainer, config.output_dir)  # all processes: ZeRO-3 gathers the whole weights
    if config.output_dir and trainer.accelerator.is_main_process:
        model = trainer.accelerator.unwrap_model(trainer.model)
        base = getattr(getattr(getattr(model, "pretrained_model", model), "config", None), "_name_or_path", None)
        write_card_for_run(config.output_dir, trainer, "PPO", config.output_dir, base)
    return stats


def _check_dataset(trainer, dataset, prompt_column: str) -> None:
    if trainer.is_encoder_decoder:
        raise ValueError(
            "train() samples with decoder-only generation; an encoder-decoder (AutoModelForSeq2SeqLMWithValueHead) "
            "trains through TRL v0.7.1's loop: ppo_trainer.generate(queries) -> your scores -> ppo_trainer.step(...)."
        )
    if dataset is None:
        raise ValueError("train() needs a dataset: PPOTrainer(config, model, tokenizer=..., dataset=...).")
    columns = getattr(dataset, "column_names", None)
    if columns is None or prompt_column not in columns:
        raise ValueError(
            f"train() needs a datasets.Dataset with a {prompt_column!r} column (text or chat messages); got "
            f"columns {columns}. Rename your prompt column or pass prompt_column=..."
        )
    needed = trainer.config.batch_size * trainer.accelerator.num_processes
    if len(dataset) < needed:
        raise ValueError(
            f"the dataset has {len(dataset)} rows but one step needs batch_size * processes = {needed}; "
            "lower config.batch_size or use more prompts."
        )


def _rows_for_step(trainer, n: int, step: int) -> list[int]:
    """This process's rows for ``step``: epoch e is a permutation seeded with ``seed + e`` (drop_last)."""
    config, accelerator = trainer.config, trainer.accelerator
    per_step = config.batch_size * accelerator.num_processes
    steps_per_epoch = n // per_step
    epoch, within = divmod(step, steps_per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(config.seed + epoch))
    start = within * per_step + accelerator.process_index * config.batch_size
    return order[start : start + config.batch_size].tolist()


def _generation_config(trainer, overrides: dict) -> GenerationConfig:
    tokenizer = trainer.tokenizer
    kwargs = {
        "max_new_tokens": 32,
        "do_sample": True,
        "top_k": 0,
        "top_p": 1.0,
        "temperature": trainer.config.temperature,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    kwargs.update(overrides)
    if kwargs.get("temperature") != trainer.config.temperature:
        raise ValueError(
            f"generation temperature {kwargs['temperature']} differs from config.temperature "
            f"{trainer.config.temperature}; set PPOConfig(temperature=...) so the log-probs match the sampling."
        )
    return GenerationConfig(**kwargs)


def _rollout(trainer, rows: dict, funcs, generation_config, max_prompt_length, prompt_column: str, step: int):
    """Generate one response per row and score it: (queries, responses, texts, per-function scores (N, F),
    combined scores (N,) with unscored samples at 0)."""
    tokenizer, device = trainer.tokenizer, trainer.accelerator.device
    prompts = rows[prompt_column]
    ids, mask = tokenize_prompts(tokenizer, prompts_to_text(tokenizer, prompts), max_prompt_length)
    ids, mask = ids.to(device), mask.to(device)
    with trainer.unwrap_for_generation() as model:  # ZeRO-3: gathered once for the batch (ds3_gather_for_generation)
        completion_ids, completion_mask, _ = generate_completions(model, ids, mask, generation_config)
    queries = [row[m.bool()] for row, m in zip(ids, mask)]
    responses = [row[m.bool()] for row, m in zip(completion_ids, completion_mask)]
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    completions = [[{"role": "assistant", "content": t}] for t in texts] if is_conversational(prompts[0]) else texts
    columns = {k: v for k, v in rows.items() if k != prompt_column}
    state = SimpleNamespace(global_step=step)
    per_func = funcs(prompts, completions, [r.tolist() for r in responses], columns, trainer_state=state)
    return queries, responses, texts, per_func, funcs.combine(per_func).nan_to_num(0.0)


def _one_step(trainer, rows: dict, funcs, generation_config, max_prompt_length, prompt_column: str, step: int):
    """Generate, score and step on one batch of dataset rows; returns (stats, scores, completions)."""
    args = (funcs, generation_config, max_prompt_length, prompt_column, step)
    queries, responses, texts, per_func, scores = _rollout(trainer, rows, *args)
    stats = trainer.step(queries, responses, list(scores))
    for i, name in enumerate(funcs.names):
        stats[f"rewards/{name}/mean"] = per_func[:, i].nanmean().item()
    return stats, scores.tolist(), texts


@torch.no_grad()
def evaluate(
    trainer,
    dataset,
    reward_funcs,
    generation_kwargs: dict | None = None,
    num_samples: int = 1,
    max_prompt_length: int | None = None,
    prompt_column: str = "prompt",
) -> float:
    """Mean reward of ``num_samples`` sampled responses per prompt of ``dataset``; no training, and the caller's
    RNG streams are left as they were (so evaluating does not change the training run)."""
    funcs = RewardFunctions(reward_funcs)
    generation_config = _generation_config(trainer, generation_kwargs or {})
    rows = dataset[:]
    rows = {k: [v for v in values for _ in range(num_samples)] for k, values in rows.items()}
    with torch.random.fork_rng(devices=[]):
        _, _, _, _, scores = _rollout(trainer, rows, funcs, generation_config, max_prompt_length, prompt_column, 0)
    return scores.mean().item()
