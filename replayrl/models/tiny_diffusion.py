"""An offline tiny Stable Diffusion pipeline built from configs (random, seeded weights; nothing downloaded).

The same five parts as Stable Diffusion v1: a CLIP tokenizer (character-level BPE over a small local vocabulary),
a CLIP text encoder (hidden 32), a conditional UNet (channels 32, 64, one cross-attention block), a VAE
(channels 8, 16: 16x16 images <-> 8x8x4 latents) and SD's DDIM scheduler (scaled-linear betas,
``set_alpha_to_one=False``, ``steps_offset=1``). Used by tests, the `replayrl ddpo` default job and benchmarks.
Needs diffusers (``pip install replayrl[diffusers]``).
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

BOS, EOS = "<|startoftext|>", "<|endoftext|>"
CHARS = string.ascii_lowercase + string.digits + string.punctuation
MAX_PROMPT_TOKENS = 16


def require_diffusers():
    """Import diffusers, or fail with one line naming the extra to install."""
    try:
        import diffusers
    except ImportError as err:
        raise ImportError("DDPO needs diffusers: pip install replayrl[diffusers]") from err
    return diffusers


def build_clip_tokenizer(max_length: int = MAX_PROMPT_TOKENS):
    """A CLIPTokenizer with one token per character (plus its end-of-word form) and no merges: lowercase text,
    digits and punctuation; anything else maps to the unknown token (``<|endoftext|>``)."""
    from transformers import CLIPTokenizer

    symbols = [BOS, EOS] + list(CHARS) + [c + "</w>" for c in CHARS]
    vocab = {symbol: i for i, symbol in enumerate(symbols)}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def build_tiny_sd_pipeline(seed: int = 0, image_size: int = 16, vae_norm_groups: int = 8):
    """A ``diffusers.StableDiffusionPipeline`` of ~1 M parameters making ``image_size`` square RGB images.

    Weights are random but fixed by ``seed``; the VAE halves the resolution, so latents are
    ``(4, image_size / 2, image_size / 2)``. No safety checker. ``vae_norm_groups`` (1, 2, 4 or 8) is the VAE's
    GroupNorm group count: with 8 (one channel per group in the decoder's last block) the decoder's final
    GroupNorm pins each output colour's mean per image; with 1 it normalises all channels together, so the colour
    balance varies with the latents (the `replayrl ddpo` built-in job uses 1).
    """
    diffusers = require_diffusers()
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = build_clip_tokenizer()
    torch.manual_seed(seed)
    unet, vae = _tiny_unet(diffusers, image_size), _tiny_vae(diffusers, image_size, vae_norm_groups)
    text_config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_PROMPT_TOKENS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    text_encoder = CLIPTextModel(text_config)
    scheduler = diffusers.DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    return diffusers.StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def save_tiny_sd_pipeline(path: str | Path, seed: int = 0) -> Path:
    """Write the tiny pipeline with ``save_pretrained`` (loadable by ``StableDiffusionPipeline.from_pretrained``
    and ``DefaultDDPOStableDiffusionPipeline(path)``)."""
    path = Path(path)
    build_tiny_sd_pipeline(seed).save_pretrained(path)
    return path


def _tiny_unet(diffusers, image_size: int):
    return diffusers.UNet2DConditionModel(
        sample_size=image_size // 2,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=16,
    )


def _tiny_vae(diffusers, image_size: int, norm_groups: int = 8):
    return diffusers.AutoencoderKL(
        in_channels=3,
        out_channels=3,
        block_out_channels=(8, 16),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        norm_num_groups=norm_groups,
        sample_size=image_size,
    )
