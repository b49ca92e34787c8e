"""The diffusion policy DDPO trains: a Stable Diffusion pipeline whose sampler returns every step's log-prob.

`DDPOStableDiffusionPipeline` is the interface `DDPOTrainer` talks to (TRL v0.7.1's);
`DefaultDDPOStableDiffusionPipeline` implements it on diffusers' `StableDiffusionPipeline` with a DDIM scheduler,
optionally LoRA (PEFT) on the UNet.
`scheduler_step` adapts diffusers' `DDIMScheduler` to the pure math in `replayrl.algos.diffusion`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from replayrl.algos.diffusion import ddim_alphas, ddim_step_with_logprob
from replayrl.models.tiny_diffusion import require_diffusers

LORA_TARGET_MODULES = ["to_k", "to_q", "to_v", "to_out.0"]
LORA_WEIGHTS_FILE = "pytorch_lora_weights.safetensors"


@dataclass
class DDPOPipelineOutput:
    """``images: (B, 3, H, W)`` in [0, 1]; ``latents``: T + 1 tensors ``(B, C, h, w)`` (the initial noise, then
    each step's output); ``log_probs``: T tensors ``(B,)``, the log-prob of each step's output."""

    images: Tensor
    latents: list[Tensor]
    log_probs: list[Tensor]


@dataclass
class DDPOSchedulerOutput:
    """``latents: (B, C, h, w)`` (x_{t-1}) and ``log_probs: (B,)``."""

    latents: Tensor
    log_probs: Tensor


class DDPOStableDiffusionPipeline:
    """What `DDPOTrainer` needs from a diffusion pipeline (TRL v0.7.1's interface). Subclass it to train another
    pipeline; `DefaultDDPOStableDiffusionPipeline` is the Stable Diffusion implementation."""

    def __call__(self, *args, **kwargs) -> DDPOPipelineOutput:
        """Sample images, keeping every step's latents and log-probs."""
        raise NotImplementedError

    def scheduler_step(self, *args, **kwargs) -> DDPOSchedulerOutput:
        """One denoising step returning ``x_{t-1}`` and its log-prob (scoring ``prev_sample`` when given)."""
        raise NotImplementedError

    @property
    def unet(self):
        raise NotImplementedError

    @property
    def vae(self):
        raise NotImplementedError

    @property
    def tokenizer(self):
        raise NotImplementedError

    @property
    def scheduler(self):
        raise NotImplementedError

    @property
    def text_encoder(self):
        raise NotImplementedError

    @property
    def autocast(self):
        """A context-manager factory for the training forward pass (``contextlib.nullcontext`` for none)."""
        raise NotImplementedError

    def set_progress_bar_config(self, *args, **kwargs) -> None:
        raise NotImplementedError

    def save_pretrained(self, *args, **kwargs) -> None:
        raise NotImplementedError

    def get_trainable_layers(self) -> list[torch.nn.Parameter]:
        raise NotImplementedError

    def save_checkpoint(self, output_dir: str | Path) -> None:
        raise NotImplementedError

    def load_checkpoint(self, input_dir: str | Path) -> None:
        raise NotImplementedError


def scheduler_step(
    scheduler,
    model_output: Tensor,
    timestep: int | Tensor,
    sample: Tensor,
    eta: float = 1.0,
    prev_sample: Tensor | None = None,
    generator: torch.Generator | None = None,
    noise: Tensor | None = None,
) -> DDPOSchedulerOutput:
    """`DDIMScheduler.step` with a log-prob: same ``x_{t-1}`` for the same noise, ``final_alpha_cumprod`` after the
    last step. ``timestep``: an int or ``(B,)`` (each sample its own step, as in training). The math runs in
    float32 and the log-prob is that of ``x_{t-1}`` as stored (rounded to the latents' dtype, e.g. fp16), so
    training re-scores exactly what sampling scored. Shapes as in `replayrl.algos.diffusion.ddim_step_with_logprob`.
    """
    if scheduler.num_inference_steps is None:
        raise ValueError("scheduler.num_inference_steps is None: call scheduler.set_timesteps(n) first")
    timesteps = torch.as_tensor(timestep, device=sample.device).long().reshape(-1).expand(sample.shape[0])
    prev_timesteps = timesteps - scheduler.config.num_train_timesteps // scheduler.num_inference_steps
    alpha_t, alpha_prev = ddim_alphas(
        scheduler.alphas_cumprod, scheduler.final_alpha_cumprod, timesteps, prev_timesteps
    )
    kwargs = dict(
        eta=eta,
        prediction_type=scheduler.config.prediction_type,
        clip_sample_range=scheduler.config.clip_sample_range if scheduler.config.clip_sample else None,
    )
    args = (model_output.float(), sample.float(), alpha_t.float(), alpha_prev.float())
    if prev_sample is None:
        prev_sample = ddim_step_with_logprob(*args, noise=noise, generator=generator, **kwargs)[0].to(sample.dtype)
    _, log_prob = ddim_step_with_logprob(*args, prev_sample=prev_sample.float(), **kwargs)
    return DDPOSchedulerOutput(latents=prev_sample, log_probs=log_prob)


def guided_noise_pred(
    unet, latents: Tensor, timesteps: Tensor, embeds: Tensor, negative_embeds: Tensor | None, guidance_scale: float
) -> Tensor:
    """The UNet's prediction ``(B, C, h, w)``, with classifier-free guidance (arXiv:2207.12598) when
    ``negative_embeds`` is given: ``uncond + scale * (cond - uncond)``. ``embeds, negative_embeds: (B, L, D)``,
    ``timesteps: (B,)`` or a scalar."""
    if negative_embeds is None:
        return unet(latents, timesteps, encoder_hidden_states=embeds).sample
    timesteps = torch.as_tensor(timesteps, device=latents.device)
    timesteps = torch.cat([timesteps.reshape(-1).expand(latents.shape[0])] * 2)
    both = unet(torch.cat([latents] * 2), timesteps, encoder_hidden_states=torch.cat([negative_embeds, embeds])).sample
    uncond, cond = both.chunk(2)
    return uncond + guidance_scale * (cond - uncond)


@torch.no_grad()
def pipeline_step(
    pipe,
    prompt_embeds: Tensor,
    negative_prompt_embeds: Tensor | None = None,
    num_inference_steps: int = 50,
    guidance_scale: float = 7.5,
    eta: float = 1.0,
    generator: torch.Generator | None = None,
    height: int | None = None,
    width: int | None = None,
    latents: Tensor | None = None,
) -> DDPOPipelineOutput:
    """Sample ``B`` images from a ``StableDiffusionPipeline`` given ``prompt_embeds: (B, L, D)``, keeping each
    DDIM step's latents and log-probs. Guidance applies when ``guidance_scale > 1`` (``negative_prompt_embeds``
    defaults to the empty prompt's)."""
    device = prompt_embeds.device
    height = height or pipe.unet.config.sample_size * pipe.vae_scale_factor
    width = width or pipe.unet.config.sample_size * pipe.vae_scale_factor
    use_cfg = guidance_scale > 1.0
    if use_cfg and negative_prompt_embeds is None:
        negative_prompt_embeds = encode_prompts(pipe, [""] * len(prompt_embeds), device)
    pipe.scheduler.set_timesteps(num_inference_steps, device=device)
    batch = prompt_embeds.shape[0]
    latents = pipe.prepare_latents(
        batch, pipe.unet.config.in_channels, height, width, prompt_embeds.dtype, device, generator, latents
    )
    all_latents, all_log_probs = [latents], []
    for t in pipe.scheduler.timesteps:
        model_input = pipe.scheduler.scale_model_input(latents, t)
        noise_pred = guided_noise_pred(
            pipe.unet, model_input, t, prompt_embeds, negative_prompt_embeds if use_cfg else None, guidance_scale
        )
        step = scheduler_step(pipe.scheduler, noise_pred, t, latents, eta=eta, generator=generator)
        latents = step.latents
        all_latents.append(latents)
        all_log_probs.append(step.log_probs)
    images = decode_latents(pipe, latents)
    return DDPOPipelineOutput(images=images, latents=all_latents, log_probs=all_log_probs)


def decode_latents(pipe, latents: Tensor) -> Tensor:
    """Latents ``(B, C, h, w)`` -> images ``(B, 3, H, W)`` in [0, 1] (float32)."""
    images = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
    return (images.float() / 2 + 0.5).clamp(0, 1)


def encode_prompts(pipe, prompts: list[str], device: torch.device | str) -> Tensor:
    """Text-encoder hidden states ``(B, model_max_length, D)`` for ``prompts`` (padded to the tokenizer's max)."""
    ids = pipe.tokenizer(
        list(prompts),
        return_tensors="pt",
        padding="max_length",
        truncation=True,
        max_length=pipe.tokenizer.model_max_length,
    ).input_ids.to(device)
    return pipe.text_encoder(ids)[0]


class DefaultDDPOStableDiffusionPipeline(DDPOStableDiffusionPipeline):
    """A diffusers ``StableDiffusionPipeline`` as a DDPO policy.

    ``pretrained_model_name``: a hub name, a local ``save_pretrained`` folder, or a ``StableDiffusionPipeline``
    object. The scheduler becomes a ``DDIMScheduler`` from the pipeline's scheduler config. The VAE and text
    encoder are frozen; with ``use_lora`` the UNet is frozen too and a LoRA adapter (rank ``lora_rank``, on the
    attention projections, PEFT) is trained, starting as the identity, so the first samples are the base model's.
    """

    def __init__(
        self,
        pretrained_model_name: Any,
        *,
        pretrained_model_revision: str = "main",
        use_lora: bool = True,
        lora_rank: int = 4,
    ):
        diffusers = require_diffusers()
        if isinstance(pretrained_model_name, (str, os.PathLike)):
            pipe = diffusers.StableDiffusionPipeline.from_pretrained(
                str(pretrained_model_name), revision=pretrained_model_revision
            )
        elif isinstance(pretrained_model_name, diffusers.DiffusionPipeline):
            pipe = pretrained_model_name
        else:
            raise ValueError(
                f"pretrained_model_name={type(pretrained_model_name).__name__}: expected a hub name, a local folder "
                "or a diffusers StableDiffusionPipeline"
            )
        pipe.scheduler = diffusers.DDIMScheduler.from_config(pipe.scheduler.config)
        _check_scheduler(pipe.scheduler)
        self.sd_pipeline = pipe
        self.use_lora = use_lora
        pipe.vae.requires_grad_(False)
        pipe.text_encoder.requires_grad_(False)
        pipe.unet.requires_grad_(not use_lora)
        if use_lora:
            _add_lora(pipe.unet, lora_rank)
        pipe.safety_checker = None
        pipe.set_progress_bar_config(disable=True)

    def __call__(self, *args, **kwargs) -> DDPOPipelineOutput:
        return pipeline_step(self.sd_pipeline, *args, **kwargs)

    def scheduler_step(self, *args, **kwargs) -> DDPOSchedulerOutput:
        return scheduler_step(self.sd_pipeline.scheduler, *args, **kwargs)

    @property
    def unet(self):
        return self.sd_pipeline.unet

    @property
    def vae(self):
        return self.sd_pipeline.vae

    @property
    def tokenizer(self):
        return self.sd_pipeline.tokenizer

    @property
    def scheduler(self):
        return self.sd_pipeline.scheduler

    @property
    def text_encoder(self):
        return self.sd_pipeline.text_encoder

    @property
    def autocast(self):
        return contextlib.nullcontext

    def set_progress_bar_config(self, *args, **kwargs) -> None:
        self.sd_pipeline.set_progress_bar_config(*args, **kwargs)

    def get_trainable_layers(self) -> list[torch.nn.Parameter]:
        return [p for p in self.sd_pipeline.unet.parameters() if p.requires_grad]

    def save_pretrained(self, output_dir: str | Path) -> None:
        """LoRA: ``pytorch_lora_weights.safetensors`` (``StableDiffusionPipeline.load_lora_weights`` reads it);
        otherwise the whole pipeline (``StableDiffusionPipeline.from_pretrained`` reads it)."""
        if self.use_lora:
            self.save_checkpoint(output_dir)
        else:
            self.sd_pipeline.save_pretrained(output_dir)

    def save_checkpoint(self, output_dir: str | Path) -> None:
        """The trained weights only: the LoRA file, or the UNet under ``output_dir/unet``."""
        if self.use_lora:
            from diffusers.utils import convert_state_dict_to_diffusers
            from peft.utils import get_peft_model_state_dict

            layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(self.unet))
            type(self.sd_pipeline).save_lora_weights(output_dir, unet_lora_layers=layers, weight_name=LORA_WEIGHTS_FILE)
        else:
            self.unet.save_pretrained(Path(output_dir) / "unet")

    def load_checkpoint(self, input_dir: str | Path) -> None:
        """Load `save_checkpoint`'s weights into this pipeline in place (the optimizer keeps its parameters)."""
        input_dir = Path(input_dir)
        if self.use_lora:
            from diffusers.utils import convert_unet_state_dict_to_peft
            from peft import set_peft_model_state_dict

            state, _ = type(self.sd_pipeline).lora_state_dict(str(input_dir), weight_name=LORA_WEIGHTS_FILE)
            unet_state = {k.removeprefix("unet."): v for k, v in state.items() if k.startswith("unet.")}
            result = set_peft_model_state_dict(self.unet, convert_unet_state_dict_to_peft(unet_state), "default")
            if getattr(result, "unexpected_keys", None):
                raise ValueError(f"{input_dir}: LoRA weights do not fit this UNet ({result.unexpected_keys[:3]} ...)")
        else:
            from diffusers import UNet2DConditionModel

            loaded = UNet2DConditionModel.from_pretrained(input_dir / "unet")
            self.unet.load_state_dict(loaded.state_dict())


def _add_lora(unet, rank: int) -> None:
    try:
        from peft import LoraConfig
    except ImportError as err:
        raise ImportError("use_lora=True needs peft: pip install replayrl[peft] (or use_lora=False)") from err
    config = LoraConfig(r=rank, lora_alpha=rank, init_lora_weights="gaussian", target_modules=LORA_TARGET_MODULES)
    unet.add_adapter(config)


def _check_scheduler(scheduler) -> None:
    if scheduler.config.thresholding:
        raise ValueError("the scheduler uses dynamic thresholding, which the DDPO log-prob step does not support")
    if scheduler.config.set_alpha_to_one:
        raise ValueError(
            "the scheduler has set_alpha_to_one=True: the last DDIM step then has zero variance and no log-prob. "
            "Pass a pipeline with pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config, "
            "set_alpha_to_one=False) (Stable Diffusion's own setting)"
        )
