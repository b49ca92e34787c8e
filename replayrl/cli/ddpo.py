"""`replayrl ddpo [--config recipe.yaml] [--<field> value ...]`: fine-tune a diffusion model with DDPO.

Every `DDPOConfig` field is a flag, plus the script arguments below. Values come from, lowest first: the CLI's
defaults (logdir=runs/ddpo-<time>), the built-in job's settings (only without --pretrained_model), the recipe
(--config, YAML), flags. Without --pretrained_model it runs the built-in offline job: a tiny config-built Stable
Diffusion pipeline (16x16 images) learning to make its images redder. Writes metrics.jsonl, training.png, a
PNG grid of each epoch's samples (samples/epoch-N.png), checkpoints and the trained weights (final/) to logdir.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayrl.cli.common import PROG, CLIError, finish_run, help_text, make_parser, parse_with_recipe, run_dir

BUILTIN_PROMPTS = ["a cat", "a dog", "a red ball", "a blue sky"]
# The built-in job: about 1-2 min on 2 CPU cores; its reward rises over epochs against a learning-rate-0 control
# (docs/ddpo.md, measured over seeds by benchmarks/ddpo_default_job.py). Its model: the tiny pipeline, weights from
# BUILTIN_MODEL_SEED, VAE with BUILTIN_VAE_NORM_GROUPS GroupNorm groups (1: the colour balance follows the latents, so
# redness can move); --seed varies the sampling.
BUILTIN_MODEL_SEED = 0
BUILTIN_VAE_NORM_GROUPS = 1
DEFAULT_JOB: dict[str, Any] = dict(
    seed=0,  # the seed benchmarks/ddpo_default_job.py reports as "no arguments"
    num_epochs=40,
    sample_num_steps=4,
    sample_batch_size=16,
    sample_num_batches_per_epoch=2,
    train_batch_size=16,
    train_gradient_accumulation_steps=2,  # one optimizer step per epoch of 32 images
    # SGD with momentum: with epsilon far above the gradients' size (RMS ~1e-3) Adam's step is lr / eps times its
    # momentum-averaged gradient. Adam's per-weight normalisation (eps 1e-8) gives every one of the ~1 M weights a
    # step of about lr * sign(noise), and DDPO's estimate is mostly noise: its drift then swamps the ascent.
    train_learning_rate=0.2,
    train_adam_epsilon=1.0,
    mixed_precision="no",
    save_freq=10,
    use_lora=False,
)


@dataclass
class DDPOScriptArguments:
    """The model, reward and prompts; the training settings are DDPOConfig's flags."""

    _argument_group_name = "script arguments (model, reward, prompts)"

    config: str | None = field(default=None, metadata=help_text("Recipe YAML of flag values (keys = flag names)."))
    pretrained_model: str | None = field(
        default=None, metadata=help_text("Hub name or folder (None: the built-in tiny model).")
    )
    pretrained_revision: str = field(default="main", metadata=help_text("Model revision."))
    use_lora: bool = field(default=True, metadata=help_text("Train a LoRA adapter."))
    reward: str = field(
        default="redness", metadata=help_text("brightness, centre_brightness, redness or package.module:function")
    )
    prompts: str = field(
        default=",".join(BUILTIN_PROMPTS), metadata=help_text("Comma-separated prompts, drawn uniformly at random.")
    )


def parse_args(argv: list[str]) -> tuple[DDPOScriptArguments, Any]:
    """(script arguments, DDPOConfig), resolved as the module docstring says."""
    from replayrl.ddpo.config import DDPOConfig

    parser = make_parser("ddpo", (DDPOScriptArguments, DDPOConfig), description=__doc__.split("\n\n", 1)[1])
    defaults = {"logdir": run_dir("ddpo")}
    args, config = parse_with_recipe(parser, argv, "ddpo", defaults, DEFAULT_JOB, inputs=("pretrained_model",))
    return args, config


def _pipeline(args: DDPOScriptArguments):
    from replayrl.ddpo.pipeline import DefaultDDPOStableDiffusionPipeline

    if args.pretrained_model is None:
        from replayrl.models.tiny_diffusion import build_tiny_sd_pipeline

        pipe = build_tiny_sd_pipeline(BUILTIN_MODEL_SEED, vae_norm_groups=BUILTIN_VAE_NORM_GROUPS)
        return DefaultDDPOStableDiffusionPipeline(pipe, use_lora=args.use_lora)
    try:
        return DefaultDDPOStableDiffusionPipeline(
            args.pretrained_model, pretrained_model_revision=args.pretrained_revision, use_lora=args.use_lora
        )
    except (OSError, ValueError) as err:
        raise CLIError(f"cannot load {args.pretrained_model!r}: {err}") from err


def build_trainer(args: DDPOScriptArguments, config):
    from replayrl.ddpo.rewards import get_image_reward, save_image_grid
    from replayrl.ddpo.trainer import DDPOTrainer

    try:
        reward = get_image_reward(args.reward)
    except ValueError as err:
        raise CLIError(str(err)) from err
    prompts = [p.strip() for p in args.prompts.split(",") if p.strip()]
    if not prompts:
        raise CLIError("--prompts is empty: give comma-separated prompts")
    run_dir = Path(config.logdir)
    scale = max(1, 64 // 16) if args.pretrained_model is None else 1

    def prompt_fn():
        return random.choice(prompts), {}

    def save_grid(prompt_image_data, global_step, tracker):
        import torch

        images = torch.cat([batch[0] for batch in prompt_image_data])
        epoch = len(list((run_dir / "samples").glob("epoch-*.png")))
        save_image_grid(images, run_dir / "samples" / f"epoch-{epoch}.png", scale=scale)

    try:
        return DDPOTrainer(config, reward, prompt_fn, _pipeline(args), image_samples_hook=save_grid)
    except ValueError as err:
        raise CLIError(str(err)) from err


def run(argv: list[str]) -> int:
    start = time.perf_counter()
    args, config = parse_args(argv)  # first: --help and bad flags answer at once
    try:
        import diffusers  # noqa: F401
    except ImportError as err:
        raise CLIError("replayrl ddpo needs diffusers: pip install replayrl[diffusers]") from err
    import torch

    job = "built-in job: tiny pipeline" if args.pretrained_model is None else args.pretrained_model
    print(f"{PROG} ddpo: {job}; reward {args.reward}; logdir {config.logdir}", flush=True)
    threads = torch.get_num_threads()
    if args.pretrained_model is None:
        torch.set_num_threads(1)  # a tiny model: threads only spin on a busy machine
    try:
        trainer = build_trainer(args, config)
        trainer.train()
        trainer.save_pretrained(Path(config.logdir) / "final")
    finally:
        torch.set_num_threads(threads)
    out = Path(config.logdir)
    extra = [f"samples: {out / 'samples'}/epoch-N.png", f"weights: {out / 'final'}"]
    steps = f"{trainer.global_step} optimizer steps"
    finish_run("ddpo", out, steps, time.perf_counter() - start, _reward_lines, extra, saved=None)
    return 0


def _reward_lines(records: list[dict]) -> list[str]:
    from replayrl.metrics import series

    _, rewards = series(records, "reward_mean")
    if not rewards:
        return []
    return [f"reward_mean: {rewards[0]:.4f} (epoch 0) -> {rewards[-1]:.4f} (last epoch), max {max(rewards):.4f}"]
