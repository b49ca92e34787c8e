"""`replayrl ddpo [--config recipe.yaml] [--<field> value ...]`: fine-tune a diffusion model with DDPO.

Every `DDPOConfig` field is a flag, plus the script arguments below. Values come from, lowest first: the CLI's
defaults (logdir=runs/ddpo-<time>), the built-in job's settings (only without --pretrained_model), the recipe
(--config, YAML), flags. Without --pretrained_model it runs the built-in offline job: a tiny config-built Stable
Diffusion pipeline (16x16 images) learning to make its images redder. Writes metrics.jsonl, training.png, a
PNG grid of each epoch's samples (samples/epoch-N.png), checkpoints and the trained weights (final/) to logdir.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from replayrl.cli.common import PROG, ArgParser, CLIError, HelpFormatter, load_recipe, set_defaults

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
SCRIPT_ARGS = ("config", "pretrained_model", "pretrained_revision", "use_lora", "reward", "prompts")


def _bool(text: str) -> bool:
    if str(text).lower() in ("1", "true", "yes", "y"):
        return True
    if str(text).lower() in ("0", "false", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> ArgParser:
    from replayrl.ddpo.config import DDPOConfig

    parser = ArgParser(
        prog=f"{PROG} ddpo",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    script = parser.add_argument_group("script arguments (model, reward, prompts)")
    script.add_argument("--config", default=None, help="recipe YAML of flag values (keys = flag names)")
    script.add_argument("--pretrained_model", default=None, help="hub name or folder (None: the built-in tiny model)")
    script.add_argument("--pretrained_revision", default="main", help="model revision")
    script.add_argument("--use_lora", type=_bool, nargs="?", const=True, default=True, help="train a LoRA adapter")
    script.add_argument(
        "--reward",
        default="redness",
        help="brightness, centre_brightness, redness or package.module:function",
    )
    script.add_argument(
        "--prompts", default=",".join(BUILTIN_PROMPTS), help="comma-separated prompts, drawn uniformly at random"
    )
    training = parser.add_argument_group("training arguments (DDPOConfig)")
    for f in fields(DDPOConfig):
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        kind = {bool: _bool, int: int, float: float}.get(type(default), str)
        if isinstance(default, dict):
            kind = json.loads
        extra = {"nargs": "?", "const": True} if kind is _bool else {}
        training.add_argument(f"--{f.name}", type=kind, default=default, help=f.metadata.get("help", ""), **extra)
    return parser


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, Any]:
    """(script arguments, DDPOConfig), resolved as the module docstring says."""
    from replayrl.ddpo.config import DDPOConfig

    parser = build_parser()
    pre = ArgParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--pretrained_model")
    known = pre.parse_known_args(argv)[0]
    recipe = load_recipe(known.config) if known.config else {}
    set_defaults(parser, {"logdir": f"runs/ddpo-{time.strftime('%Y%m%d-%H%M%S')}"}, "CLI defaults")
    if (known.pretrained_model or recipe.get("pretrained_model")) is None:
        parser.set_defaults(**DEFAULT_JOB)
    set_defaults(parser, recipe, known.config)
    args = parser.parse_args(argv)
    values = {k: v for k, v in vars(args).items() if k not in SCRIPT_ARGS}
    try:
        config = DDPOConfig(**values)
    except ValueError as err:
        raise CLIError(str(err)) from err
    return args, config


def _pipeline(args: argparse.Namespace):
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


def build_trainer(args: argparse.Namespace, config):
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

    from replayrl.metrics import METRICS_FILE, read_metrics, series
    from replayrl.metrics.plot import plot_run

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
    plot = plot_run(config.logdir)
    _, rewards = series(read_metrics(Path(config.logdir) / METRICS_FILE), "reward_mean")
    print(f"\n{PROG} ddpo: done, {trainer.global_step} optimizer steps in {time.perf_counter() - start:.0f} s")
    if rewards:
        print(f"  reward_mean: {rewards[0]:.4f} (epoch 0) -> {rewards[-1]:.4f} (last epoch), max {max(rewards):.4f}")
    print(f"  metrics: {Path(config.logdir) / METRICS_FILE}\n  plot: {plot}  (re-draw: {PROG} plot {config.logdir})")
    print(f"  samples: {Path(config.logdir) / 'samples'}/epoch-N.png\n  weights: {Path(config.logdir) / 'final'}")
    return 0
