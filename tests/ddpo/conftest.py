"""Tiny offline DDPO setups: a config-built Stable Diffusion pipeline (16x16 images) and a learnable reward."""

import math
import os
import random

import pytest

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


@pytest.fixture
def deterministic():
    """Deterministic switches for tests that compare two runs: on a GPU, cuDNN picks kernels by timing and some
    of them (and TF32 matmuls) round differently from run to run. On the CPU nothing changes. Restored after."""
    import torch

    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS' condition for deterministic matmuls
    # warn_only: a few CUDA backward kernels (nearest upsampling in the UNet) have no deterministic version
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def assert_same_runs(a, b) -> None:
    """Two runs' metric records (or tensors) are equal: bit for bit on the CPU; on a GPU, whose atomics-based
    kernels (nearest-upsampling backward) stay non-deterministic even with the switches above, to 1e-3 relative."""
    import torch

    if not torch.cuda.is_available():
        assert a == b if not isinstance(a, torch.Tensor) else torch.equal(a, b)
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)
    else:
        assert len(a) == len(b) and all(x.keys() == y.keys() for x, y in zip(a, b))
        for x, y in zip(a, b):
            for key, value in x.items():
                same = value == y[key] or math.isclose(value, y[key], rel_tol=1e-3, abs_tol=1e-6)
                assert same, (key, value, y[key])


def tiny_pipeline(seed=0, use_lora=True):
    from replayrl.ddpo import DefaultDDPOStableDiffusionPipeline
    from replayrl.models.tiny_diffusion import build_tiny_sd_pipeline

    return DefaultDDPOStableDiffusionPipeline(build_tiny_sd_pipeline(seed), use_lora=use_lora)


def tiny_trainer(tmp_path, reward=centre_brightness, hook=None, use_lora=True, **overrides):
    from replayrl.ddpo import DDPOTrainer

    return DDPOTrainer(tiny_config(tmp_path, **overrides), reward, prompt_fn, tiny_pipeline(use_lora=use_lora), hook)
