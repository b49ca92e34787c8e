"""Tiny offline DDPO setups: a config-built Stable Diffusion pipeline (16x16 images) and a learnable reward."""

import random

PROMPTS = ["a cat", "a dog"]


def centre_brightness(images, prompts, metadata):
    """Mean brightness of the central 8x8 pixels, (B,), plus per-image metadata."""
    return images[:, :, 4:12, 4:12].mean(dim=(1, 2, 3)), [{"prompt": p} for p in prompts]


def prompt_fn():
    return random.choice(PROMPTS), {"source": "test"}


def tiny_config(tmp_path, **overrides):
    from replayrl.ddpo import DDPOConfig

    kwargs = dict(
        logdir=str(tmp_path / "run"),
        num_epochs=2,
        seed=0,
        sample_num_steps=3,
        sample_batch_size=4,
        sample_num_batches_per_epoch=1,
        train_batch_size=4,
        train_learning_rate=1e-3,
        mixed_precision="no",
        save_freq=0,
    )
    kwargs.update(overrides)
    return DDPOConfig(**kwargs)


def tiny_pipeline(seed=0, use_lora=True):
    from replayrl.ddpo import DefaultDDPOStableDiffusionPipeline
    from replayrl.models.tiny_diffusion import build_tiny_sd_pipeline

    return DefaultDDPOStableDiffusionPipeline(build_tiny_sd_pipeline(seed), use_lora=use_lora)


def tiny_trainer(tmp_path, reward=centre_brightness, hook=None, use_lora=True, **overrides):
    from replayrl.ddpo import DDPOTrainer

    return DDPOTrainer(tiny_config(tmp_path, **overrides), reward, prompt_fn, tiny_pipeline(use_lora=use_lora), hook)
