"""Image rewards for DDPO's built-in job and examples: ``reward(images, prompts, metadata) -> (rewards, metadata)``
with ``images: (B, 3, H, W)`` in [0, 1] and ``rewards: (B,)``; and a PNG grid of sample images.

Why the built-in job rewards redness with a one-group VAE: the tiny random VAE decoder ends in GroupNorm; with one
channel per group it pins each image's mean per colour (brightness std 0.002 across samples, redness 0.003), with one
group for all channels the colour balance follows the latents (redness std ~0.02), so a policy can move it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
from torch import Tensor


def brightness(images: Tensor, prompts, metadata) -> tuple[Tensor, dict]:
    """Mean pixel value of each image, (B,)."""
    return images.float().mean(dim=(1, 2, 3)), {}


def centre_brightness(images: Tensor, prompts, metadata) -> tuple[Tensor, dict]:
    """Mean pixel value of the central half (by side) of each image, (B,)."""
    h, w = images.shape[-2:]
    centre = images[..., h // 4 : h - h // 4, w // 4 : w - w // 4]
    return centre.float().mean(dim=(1, 2, 3)), {}


def redness(images: Tensor, prompts, metadata) -> tuple[Tensor, dict]:
    """Red minus the mean of green and blue, averaged over pixels, (B,)."""
    images = images.float()
    return (images[:, 0] - (images[:, 1] + images[:, 2]) / 2).mean(dim=(1, 2)), {}


BUILTIN_REWARDS = {"brightness": brightness, "centre_brightness": centre_brightness, "redness": redness}


def get_image_reward(spec: str):
    """A built-in reward by name, or ``package.module:function``."""
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    if ":" not in spec:
        raise ValueError(f"unknown reward {spec!r}: use one of {', '.join(BUILTIN_REWARDS)} or package.module:function")
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import reward {spec!r}: {err}") from err


def save_image_grid(images: Tensor, path: str | Path, columns: int = 8, scale: int = 1) -> Path:
    """Write ``images: (B, 3, H, W)`` in [0, 1] as one PNG grid (``columns`` per row, each pixel ``scale``
    pixels wide, 2-pixel gaps)."""
    from PIL import Image

    images = images.detach().float().cpu().clamp(0, 1)
    if scale > 1:
        images = images.repeat_interleave(scale, dim=-2).repeat_interleave(scale, dim=-1)
    count, _, h, w = images.shape
    columns = min(columns, count)
    rows = -(-count // columns)
    gap = 2
    grid = torch.ones(3, rows * (h + gap) - gap, columns * (w + gap) - gap)
    for i, image in enumerate(images):
        r, c = divmod(i, columns)
        grid[:, r * (h + gap) : r * (h + gap) + h, c * (w + gap) : c * (w + gap) + w] = image
    array = (grid.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path
