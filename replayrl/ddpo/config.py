"""`DDPOConfig`: TRL v0.7.1's DDPO parameters, names and defaults, with the batch arithmetic checked once.

One epoch samples ``sample_batch_size * sample_num_batches_per_epoch`` images per process, then trains on them in
batches of ``train_batch_size`` with an optimizer step every ``train_gradient_accumulation_steps`` batches (and,
inside each batch, over the ``int(sample_num_steps * train_timestep_fraction)`` denoising steps trained).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class DDPOConfig:
    """Configuration for [`DDPOTrainer`] (DDPO, arXiv:2305.13301). Every field is a `replayrl ddpo --<field>` flag."""

    # Run, logging, trackers
    exp_name: str = field(default="ddpo", metadata=_help("Experiment name, used for the tracker run name."))
    run_name: str = field(default="", metadata=_help("Run name for the tracker (default: exp_name)."))
    seed: int = field(default=42, metadata=_help("Seed for sampling noise, prompts (python random) and init."))
    logdir: str = field(
        default="logs",
        metadata=_help(
            "Run directory: metrics.jsonl and checkpoints/ go here (project_kwargs['project_dir'] overrides it)."
        ),
    )
    log_with: str | None = field(
        default=None,
        metadata=_help("Accelerate tracker: 'wandb', 'tensorboard', 'all', ... (None: metrics file only)."),
    )
    tracker_kwargs: dict[str, Any] | str | None = field(
        default_factory=dict, metadata=_help("Passed to init_trackers.")
    )
    accelerator_kwargs: dict[str, Any] | str | None = field(
        default_factory=dict, metadata=_help("Passed to Accelerator.")
    )
    project_kwargs: dict[str, Any] | str | None = field(
        default_factory=dict, metadata=_help("Passed to accelerate's ProjectConfiguration (project_dir, logging_dir).")
    )
    tracker_project_name: str = field(default="trl", metadata=_help("Project name for the trackers."))
    # Schedule, checkpoints, precision
    num_epochs: int = field(default=100, metadata=_help("Epochs (sample, then train) to run."))
    save_freq: int = field(default=1, metadata=_help("Save a checkpoint every this many epochs (0: never)."))
    num_checkpoint_limit: int = field(default=5, metadata=_help("Keep at most this many checkpoints (oldest go)."))
    mixed_precision: str | None = field(
        default="fp16",
        metadata=_help(
            "'no', 'fp16' or 'bf16' for the frozen parts and autocast; CPU runs use 'no' (fp16 is GPU-only). "
            "None (as TRL v0.7.1 lets accelerate choose) is read as 'no'."
        ),
    )
    allow_tf32: bool = field(default=True, metadata=_help("Allow TF32 matmuls on Ampere+ GPUs."))
    resume_from: str = field(
        default="", metadata=_help("Checkpoint folder to resume from, or a run's checkpoints/ folder (the latest).")
    )
    # Sampling
    sample_num_steps: int = field(default=50, metadata=_help("DDIM denoising steps per image."))
    sample_eta: float = field(default=1.0, metadata=_help("DDIM eta (> 0: each step must be stochastic)."))
    sample_guidance_scale: float = field(default=5.0, metadata=_help("Classifier-free guidance scale."))
    sample_batch_size: int = field(default=1, metadata=_help("Images per sampling batch, per process."))
    sample_num_batches_per_epoch: int = field(default=2, metadata=_help("Sampling batches per epoch."))
    negative_prompts: str | None = field(default="", metadata=_help("Negative prompt for guidance ('' = none)."))
    # Training
    train_batch_size: int = field(default=1, metadata=_help("Samples per training batch, per process."))
    train_use_8bit_adam: bool = field(default=False, metadata=_help("bitsandbytes 8-bit Adam (GPU)."))
    train_learning_rate: float = field(default=3e-4, metadata=_help("Learning rate."))
    train_adam_beta1: float = field(default=0.9, metadata=_help("Adam beta1."))
    train_adam_beta2: float = field(default=0.999, metadata=_help("Adam beta2."))
    train_adam_weight_decay: float = field(default=1e-4, metadata=_help("AdamW weight decay."))
    train_adam_epsilon: float = field(default=1e-8, metadata=_help("Adam epsilon."))
    train_gradient_accumulation_steps: int = field(
        default=1, metadata=_help("Training batches per optimizer step (on top of accumulating over timesteps).")
    )
    train_max_grad_norm: float = field(default=1.0, metadata=_help("Gradient clipping norm."))
    train_num_inner_epochs: int = field(default=1, metadata=_help("Passes over each epoch's samples."))
    train_cfg: bool = field(default=True, metadata=_help("Use classifier-free guidance in training too."))
    train_adv_clip_max: float = field(default=5.0, metadata=_help("Clip advantages to [-this, this]."))
    train_clip_range: float = field(default=1e-4, metadata=_help("PPO clip range of the per-step ratio."))
    train_timestep_fraction: float = field(default=1.0, metadata=_help("Fraction of denoising steps trained on."))
    # Advantages, rewards
    per_prompt_stat_tracking: bool = field(
        default=False, metadata=_help("Normalise rewards per prompt over a reward history (else over the batch).")
    )
    per_prompt_stat_tracking_buffer_size: int = field(default=16, metadata=_help("Rewards kept per prompt."))
    per_prompt_stat_tracking_min_count: int = field(
        default=16, metadata=_help("Use a prompt's history once it holds this many rewards (batch stats before).")
    )
    async_reward_computation: bool = field(
        default=False, metadata=_help("Compute rewards in a thread pool while the next batch samples.")
    )
    max_workers: int = field(default=2, metadata=_help("Threads for asynchronous reward computation."))

    def __post_init__(self):
        for name in ("tracker_kwargs", "accelerator_kwargs", "project_kwargs"):
            value = getattr(self, name)
            if isinstance(value, str) or value is None:  # from the command line (JSON) or a recipe
                setattr(self, name, json.loads(value) if value and value.strip() else {})
        if self.negative_prompts is None:
            self.negative_prompts = ""
        if self.mixed_precision is None:  # TRL v0.7.1 hands None to Accelerator: its default, full precision
            self.mixed_precision = "no"
        self.check(num_processes=1)

    @property
    def num_train_timesteps(self) -> int:
        """Denoising steps trained per sample: ``int(sample_num_steps * train_timestep_fraction)``."""
        return int(self.sample_num_steps * self.train_timestep_fraction)

    def check(self, num_processes: int = 1) -> None:
        """Raise ValueError, naming the value and the fix, for any setting DDPO cannot run with."""
        _check_positive(self)
        if not 0 < self.train_timestep_fraction <= 1:
            raise ValueError(f"train_timestep_fraction={self.train_timestep_fraction}: must be in (0, 1]")
        if self.num_train_timesteps < 1:
            raise ValueError(
                f"train_timestep_fraction={self.train_timestep_fraction} of sample_num_steps={self.sample_num_steps} "
                "trains 0 steps: raise either"
            )
        if self.mixed_precision not in ("no", "fp16", "bf16"):
            raise ValueError(f"mixed_precision={self.mixed_precision!r}: expected 'no', 'fp16' or 'bf16'")
        if self.train_cfg and self.sample_guidance_scale <= 1.0:
            raise ValueError(
                f"train_cfg=True with sample_guidance_scale={self.sample_guidance_scale}: sampling skips guidance at "
                "scale <= 1 but training would apply it, so the ratio would not start at 1; set train_cfg=False or a "
                "guidance scale > 1"
            )
        if self.per_prompt_stat_tracking and (
            self.per_prompt_stat_tracking_min_count > self.per_prompt_stat_tracking_buffer_size
        ):
            raise ValueError(
                f"per_prompt_stat_tracking_min_count={self.per_prompt_stat_tracking_min_count} > "
                f"per_prompt_stat_tracking_buffer_size={self.per_prompt_stat_tracking_buffer_size}: the history "
                "could never reach min_count; lower min_count or raise buffer_size"
            )
        _check_batches(self, num_processes)


def _check_positive(config: DDPOConfig) -> None:
    for name in (
        "num_epochs",
        "sample_num_steps",
        "sample_batch_size",
        "sample_num_batches_per_epoch",
        "train_batch_size",
        "train_gradient_accumulation_steps",
        "train_num_inner_epochs",
        "per_prompt_stat_tracking_buffer_size",
        "per_prompt_stat_tracking_min_count",
        "max_workers",
    ):
        if getattr(config, name) < 1:
            raise ValueError(f"{name}={getattr(config, name)}: must be >= 1")
    for name in ("sample_eta", "train_learning_rate", "train_adv_clip_max"):
        if getattr(config, name) <= 0:
            extra = " (eta = 0 is deterministic DDIM: a step then has no log-prob)" if name == "sample_eta" else ""
            raise ValueError(f"{name}={getattr(config, name)}: must be > 0{extra}")
    if config.train_clip_range < 0 or config.save_freq < 0 or config.num_checkpoint_limit < 0:
        raise ValueError("train_clip_range, save_freq and num_checkpoint_limit must be >= 0")


def _check_batches(config: DDPOConfig, num_processes: int) -> None:
    """Each sampling batch splits into whole training batches, and an epoch into whole optimizer steps."""
    if config.sample_batch_size % config.train_batch_size:
        raise ValueError(
            f"sample_batch_size={config.sample_batch_size} is not a multiple of train_batch_size="
            f"{config.train_batch_size}: make train_batch_size a divisor of it (e.g. {config.sample_batch_size}) "
            "or raise sample_batch_size"
        )
    samples_per_epoch = config.sample_batch_size * config.sample_num_batches_per_epoch * num_processes
    total_train_batch = config.train_batch_size * config.train_gradient_accumulation_steps * num_processes
    if samples_per_epoch % total_train_batch:
        steps = samples_per_epoch // (config.train_batch_size * num_processes)
        raise ValueError(
            f"an epoch samples sample_batch_size * sample_num_batches_per_epoch * processes = {samples_per_epoch} "
            f"images, not a multiple of one optimizer step's train_batch_size * train_gradient_accumulation_steps "
            f"* processes = {total_train_batch}: the last step would be partial. Set "
            f"train_gradient_accumulation_steps to a divisor of {steps} or change sample_num_batches_per_epoch"
        )
