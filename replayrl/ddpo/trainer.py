"""`DDPOTrainer`: Denoising Diffusion Policy Optimization (DDPO-clip, arXiv:2305.13301) on a diffusers pipeline.

Each epoch, as in the paper and TRL v0.7.1's DDPOTrainer:
  1. sample ``sample_num_batches_per_epoch`` batches of images, keeping every DDIM step's latents and log-prob
     (each step ``x_t -> x_{t-1}`` is a Gaussian action, `replayrl.algos.diffusion`);
  2. score them with ``reward_function(images, prompts, metadata) -> (rewards, reward_metadata)`` (in a thread
     pool while the next batch samples, with ``async_reward_computation``);
  3. advantages: rewards normalised per prompt over a bounded history (``per_prompt_stat_tracking``) or over the
     batch, clipped to ``train_adv_clip_max`` in the loss;
  4. ``train_num_inner_epochs`` passes over the samples, shuffled, each sample's denoising steps shuffled and the
     first ``train_timestep_fraction`` of them trained: PPO-clip on the per-step ratio, one optimizer step per
     ``train_gradient_accumulation_steps`` batches x trained steps.
Before the first update the ratio is exactly 1: training recomputes the sampled step with the same inputs.
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent import futures
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from replayrl.algos.diffusion import (
    PerPromptStatTracker,
    batch_advantages,
    clipped_surrogate_loss,
    ddpo_clipped_loss,
)
from replayrl.checkpoints import checkpoints_in, refuse_stale_checkpoints, rng_state, save_extra_state
from replayrl.ddpo.config import DDPOConfig
from replayrl.ddpo.pipeline import DDPOStableDiffusionPipeline, encode_prompts, guided_noise_pred
from replayrl.ddpo.state import latest_checkpoint, load_checkpoint_state, mark_checkpoint
from replayrl.metrics import METRICS_FILE, MetricsFile
from replayrl.model_card import write_card_for_run

logger = logging.getLogger(__name__)
STATE_NAME = "ddpo_state"


class DDPOTrainer:
    """Train ``sd_pipeline``'s UNet (or its LoRA) with DDPO on ``reward_function``.

    ``prompt_function() -> (prompt, metadata)`` is called once per image; ``image_samples_hook(prompt_image_data,
    global_step, tracker)`` is called each epoch with, per sampling batch, ``[images (B, 3, H, W) in [0, 1],
    prompts, prompt_metadata, rewards (B,), reward_metadata]`` and the first accelerate tracker (or None).
    """

    def __init__(
        self,
        config: DDPOConfig,
        reward_function: Callable[[Tensor, tuple[str, ...], tuple[Any, ...]], tuple[Any, Any]],
        prompt_function: Callable[[], tuple[str, Any]],
        sd_pipeline: DDPOStableDiffusionPipeline,
        image_samples_hook: Callable[[Any, Any, Any], Any] | None = None,
    ):
        if not isinstance(sd_pipeline, DDPOStableDiffusionPipeline):
            raise ValueError(
                f"sd_pipeline is a {type(sd_pipeline).__name__}: wrap a diffusers pipeline in "
                "DefaultDDPOStableDiffusionPipeline(pipe) (or implement DDPOStableDiffusionPipeline)"
            )
        self.config = config
        self.reward_fn = reward_function
        self.prompt_fn = prompt_function
        self.sd_pipeline = sd_pipeline
        self.image_samples_callback = image_samples_hook
        self.run_dir = Path(config.project_kwargs.get("project_dir") or config.logdir)
        self.accelerator = self._build_accelerator()
        config.check(num_processes=self.accelerator.num_processes)
        self._seed_everything()
        self._place_pipeline()
        self.trainable_layers = sd_pipeline.get_trainable_layers()
        if not self.trainable_layers:
            raise ValueError("sd_pipeline.get_trainable_layers() is empty: nothing to train")
        self.optimizer = self._build_optimizer()
        self.unet, self.optimizer = self.accelerator.prepare(sd_pipeline.unet, self.optimizer)
        self.neg_prompt_embed = encode_prompts(sd_pipeline, [config.negative_prompts], self.accelerator.device)
        self.stat_tracker = (
            PerPromptStatTracker(config.per_prompt_stat_tracking_buffer_size, config.per_prompt_stat_tracking_min_count)
            if config.per_prompt_stat_tracking
            else None
        )
        self.executor = futures.ThreadPoolExecutor(config.max_workers) if config.async_reward_computation else None
        self.metrics = MetricsFile(self.run_dir / METRICS_FILE, enabled=self.accelerator.is_main_process)
        self.first_epoch, self.global_step = 0, 0
        if config.resume_from:
            self._resume(config.resume_from)
        else:
            refuse_stale_checkpoints(
                self.run_dir,
                resume_hint=f"resume_from={str(self.run_dir)!r}",
                overwrite_hint=None,
                elsewhere="another logdir (or project_kwargs['project_dir'])",
            )

    # ------------------------------------------------------------------------------------------------ setup
    def _build_accelerator(self):
        from accelerate import Accelerator
        from accelerate.utils import ProjectConfiguration

        config = self.config
        mixed_precision = config.mixed_precision
        if mixed_precision != "no" and not torch.cuda.is_available():
            logger.warning("mixed_precision=%r needs a GPU: running in float32 on CPU", mixed_precision)
            mixed_precision = "no"
        project = {"project_dir": str(self.run_dir), **config.project_kwargs}
        accelerator = Accelerator(
            log_with=config.log_with,
            mixed_precision=mixed_precision,
            project_config=ProjectConfiguration(**project),
            **config.accelerator_kwargs,
        )
        if accelerator.is_main_process and config.log_with:
            accelerator.init_trackers(
                config.tracker_project_name,
                config=asdict(config),
                init_kwargs=config.tracker_kwargs or {"wandb": {"name": config.run_name or config.exp_name}},
            )
        return accelerator

    def _seed_everything(self) -> None:
        seed = self.config.seed + self.accelerator.process_index
        random.seed(seed)
        torch.manual_seed(seed)
        self.generator = torch.Generator().manual_seed(seed)  # sampling noise and shuffles
        if torch.cuda.is_available() and self.config.allow_tf32:
            torch.backends.cuda.matmul.allow_tf32 = True

    def _place_pipeline(self) -> None:
        """Frozen parts in the inference dtype; trainable weights in float32 (fp16 Adam states would underflow)."""
        pipe, device = self.sd_pipeline, self.accelerator.device
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(self.accelerator.mixed_precision, torch.float32)
        cast = {} if dtype == torch.float32 else {"dtype": dtype}  # a no-op cast still warns in diffusers
        pipe.vae.to(device, **cast)
        pipe.text_encoder.to(device, **cast)
        pipe.unet.to(device, **cast)
        for param in pipe.unet.parameters():
            if param.requires_grad:
                param.data = param.data.float()
        pipe.set_progress_bar_config(disable=True)
        self.inference_dtype = dtype

    def _build_optimizer(self) -> torch.optim.Optimizer:
        config = self.config
        optimizer_cls = torch.optim.AdamW
        if config.train_use_8bit_adam:
            try:
                import bitsandbytes
            except ImportError as err:
                raise ImportError("train_use_8bit_adam=True needs bitsandbytes: pip install bitsandbytes") from err
            optimizer_cls = bitsandbytes.optim.AdamW8bit
        return optimizer_cls(
            self.trainable_layers,
            lr=config.train_learning_rate,
            betas=(config.train_adam_beta1, config.train_adam_beta2),
            weight_decay=config.train_adam_weight_decay,
            eps=config.train_adam_epsilon,
        )

    # ------------------------------------------------------------------------------------------------ loop
    def train(self, epochs: int | None = None) -> None:
        """Run epochs ``first_epoch .. epochs - 1`` (``epochs`` defaults to ``config.num_epochs``)."""
        epochs = self.config.num_epochs if epochs is None else epochs
        self.metrics.start(self.global_step)
        for epoch in range(self.first_epoch, epochs):
            self.global_step = self.step(epoch, self.global_step)
        self.first_epoch = max(self.first_epoch, epochs)

    def step(self, epoch: int, global_step: int) -> int:
        """One epoch: sample, reward, advantages, inner epochs of PPO updates, maybe a checkpoint. Returns the new
        global (optimizer) step."""
        start = time.perf_counter()
        batches, prompt_image_data = self._generate_samples(
            iterations=self.config.sample_num_batches_per_epoch, batch_size=self.config.sample_batch_size
        )
        samples = collate_samples(batches)
        rewards = self._collect_rewards(prompt_image_data)
        if self.image_samples_callback is not None:
            trackers = self.accelerator.trackers
            self.image_samples_callback(prompt_image_data, global_step, trackers[0] if trackers else None)
        samples["advantages"] = self._advantages(rewards, samples.pop("prompts"))
        sample_seconds = time.perf_counter() - start
        for inner_epoch in range(self.config.train_num_inner_epochs):
            batches = self._shuffled_batches(samples)
            global_step = self._train_batched_samples(inner_epoch, epoch, global_step, batches)
        self.first_epoch = epoch + 1
        self.global_step = global_step
        self._log_epoch(epoch, global_step, sample_seconds, time.perf_counter() - start)
        if self.config.save_freq and (epoch + 1) % self.config.save_freq == 0:
            self.save_checkpoint()
        return global_step

    @torch.no_grad()
    def _generate_samples(self, iterations: int, batch_size: int) -> tuple[list[dict[str, Any]], list[list[Any]]]:
        """Sample ``iterations`` batches (TRL v0.7.1's return values). Returns, per batch, the training samples
        (``prompt_embeds (B, L, D)``, ``timesteps (B, T)``, ``latents``/``next_latents (B, T, C, h, w)``,
        ``log_probs (B, T)``, ``prompts``; `collate_samples` joins them) and ``[images, prompts, prompt_metadata,
        rewards (a future while pending), reward_metadata]``."""
        config, pipe, device = self.config, self.sd_pipeline, self.accelerator.device
        self.unet.eval()
        batches, image_data = [], []
        for _ in range(iterations):
            prompts, metadata = map(tuple, zip(*[self.prompt_fn() for _ in range(batch_size)]))
            prompt_embeds = encode_prompts(pipe, list(prompts), device)
            with self.accelerator.autocast():
                out = pipe(
                    prompt_embeds=prompt_embeds,
                    negative_prompt_embeds=self.neg_prompt_embed.expand(batch_size, -1, -1),
                    num_inference_steps=config.sample_num_steps,
                    guidance_scale=config.sample_guidance_scale,
                    eta=config.sample_eta,
                    generator=self.generator,
                )
            latents = torch.stack(out.latents, dim=1)  # (B, T + 1, C, h, w)
            batches.append(
                {
                    "prompt_embeds": prompt_embeds,
                    "timesteps": pipe.scheduler.timesteps.to(device).repeat(batch_size, 1),
                    "latents": latents[:, :-1],
                    "next_latents": latents[:, 1:],
                    "log_probs": torch.stack(out.log_probs, dim=1),
                    "prompts": list(prompts),
                }
            )
            rewards = self._reward(out.images, prompts, metadata)
            image_data.append([out.images, prompts, metadata, *rewards])
        return batches, image_data

    def _reward(self, images: Tensor, prompts: tuple, metadata: tuple) -> tuple[Any, Any]:
        if self.executor is not None:
            return self.executor.submit(self.reward_fn, images, prompts, metadata), None
        return self.reward_fn(images, prompts, metadata)

    def _collect_rewards(self, image_data: list[list[Any]]) -> Tensor:
        """Wait for pending rewards; store them as ``(B,)`` float tensors in ``image_data``; return all ``(N,)``."""
        for entry in image_data:
            if isinstance(entry[3], futures.Future):
                entry[3], entry[4] = entry[3].result()
            rewards = torch.as_tensor(entry[3], dtype=torch.float32).reshape(-1).to(self.accelerator.device)
            if rewards.numel() != len(entry[1]):
                raise ValueError(f"reward_function returned {rewards.numel()} rewards for {len(entry[1])} images")
            entry[3] = rewards
        return torch.cat([entry[3] for entry in image_data])

    def _advantages(self, rewards: Tensor, prompts: list[str]) -> Tensor:
        """Advantages ``(N,)`` for this process's samples, from every process's rewards (logged here)."""
        from accelerate.utils import gather_object

        all_rewards = self.accelerator.gather(rewards).cpu()
        self._epoch_stats = {"reward_mean": all_rewards.mean().item(), "reward_std": all_rewards.std().item()}
        if self.stat_tracker is not None:
            all_prompts = gather_object(list(prompts)) if self.accelerator.num_processes > 1 else list(prompts)
            advantages = self.stat_tracker.update(all_prompts, all_rewards)
        else:
            advantages = batch_advantages(all_rewards)
        rank = self.accelerator.process_index
        return advantages.reshape(self.accelerator.num_processes, -1)[rank].to(self.accelerator.device)

    def _shuffled_batches(self, samples: dict[str, Tensor]) -> list[dict[str, Tensor]]:
        """Samples shuffled, each sample's denoising steps shuffled independently, split into training batches."""
        total, num_steps = samples["timesteps"].shape
        perm = torch.randperm(total, generator=self.generator).to(self.accelerator.device)
        shuffled = {k: v[perm] for k, v in samples.items()}
        step_perms = torch.stack([torch.randperm(num_steps, generator=self.generator) for _ in range(total)])
        rows = torch.arange(total)[:, None]
        for key in ("timesteps", "latents", "next_latents", "log_probs"):
            shuffled[key] = shuffled[key][rows, step_perms.to(shuffled[key].device)]
        size = self.config.train_batch_size
        return [{k: v[i : i + size] for k, v in shuffled.items()} for i in range(0, total, size)]

    def _train_batched_samples(self, inner_epoch: int, epoch: int, global_step: int, batches: list[dict]) -> int:
        """PPO-clip over the batches; one optimizer step per ``train_gradient_accumulation_steps`` batches x
        trained timesteps (the loss of each micro-step is divided by that count)."""
        config = self.config
        accumulate = config.train_gradient_accumulation_steps * config.num_train_timesteps
        self.unet.train()
        info, micro = defaultdict(list), 0
        for batch in batches:
            embeds = batch["prompt_embeds"]
            if config.train_cfg:
                embeds = torch.cat([self.neg_prompt_embed.expand(len(embeds), -1, -1), embeds])
            for j in range(config.num_train_timesteps):
                loss, approx_kl, clipfrac = self.calculate_loss(
                    batch["latents"][:, j],
                    batch["timesteps"][:, j],
                    batch["next_latents"][:, j],
                    batch["log_probs"][:, j],
                    batch["advantages"],
                    embeds,
                )
                self.accelerator.backward(loss / accumulate)
                for name, value in (("loss", loss), ("approx_kl", approx_kl), ("clipfrac", clipfrac)):
                    info[name].append(value.detach())
                info["ratio"].append(self._last_ratio)
                micro += 1
                if micro % accumulate == 0:
                    global_step = self._optimizer_step(info, epoch, inner_epoch, global_step)
                    info = defaultdict(list)
        return global_step

    def _optimizer_step(self, info: dict[str, list[Tensor]], epoch: int, inner_epoch: int, global_step: int) -> int:
        if self.config.train_max_grad_norm:
            self.accelerator.clip_grad_norm_(self.trainable_layers, self.config.train_max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()
        global_step += 1
        stats = {k: self.accelerator.reduce(torch.stack(v).mean(), reduction="mean").item() for k, v in info.items()}
        stats.update(epoch=epoch, inner_epoch=inner_epoch)
        self.accelerator.log(stats, step=global_step)
        self.metrics.write(global_step, {k: v for k, v in stats.items() if k != "inner_epoch"})
        return global_step

    def loss(self, advantages: Tensor, clip_range: float, ratio: Tensor) -> Tensor:
        """TRL v0.7.1's clipped surrogate: ``mean(max(-A * r, -A * clip(r, 1 - clip_range, 1 + clip_range)))``."""
        return clipped_surrogate_loss(advantages, clip_range, ratio)

    def calculate_loss(
        self,
        latents: Tensor,
        timesteps: Tensor,
        next_latents: Tensor,
        log_probs: Tensor,
        advantages: Tensor,
        embeds: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The DDPO-clip loss of one denoising step for a batch: ``latents, next_latents: (B, C, h, w)``,
        ``timesteps, log_probs, advantages: (B,)``, ``embeds: (2B, L, D)`` (negative then positive) with
        ``train_cfg`` else ``(B, L, D)``. Returns ``(loss, approx_kl, clipfrac)``; the mean ratio is kept in
        ``self._last_ratio``."""
        config = self.config
        negative, positive = embeds.chunk(2) if config.train_cfg else (None, embeds)
        with self.accelerator.autocast():
            noise_pred = guided_noise_pred(
                self.unet, latents, timesteps, positive, negative, config.sample_guidance_scale
            )
            step = self.sd_pipeline.scheduler_step(
                noise_pred, timesteps, latents, eta=config.sample_eta, prev_sample=next_latents
            )
        loss, stats = ddpo_clipped_loss(
            step.log_probs, log_probs, advantages, config.train_clip_range, config.train_adv_clip_max
        )
        self._last_ratio = stats["ratio"]
        return loss, stats["approx_kl"], stats["clipfrac"]

    def _log_epoch(self, epoch: int, global_step: int, sample_seconds: float, seconds: float) -> None:
        stats = {**self._epoch_stats, "epoch": epoch, "sample_seconds": sample_seconds, "epoch_seconds": seconds}
        if self.stat_tracker is not None:
            stats.update({f"stat_tracker/{k}": v for k, v in self.stat_tracker.get_stats().items()})
        self.accelerator.log(stats, step=global_step)
        self.metrics.write(global_step, {k: stats[k] for k in ("epoch", "reward_mean", "reward_std")})

    # ------------------------------------------------------------------------------------------------ saving
    def save_pretrained(self, save_directory: str | Path) -> None:
        """The trained weights, loadable with diffusers (see `DefaultDDPOStableDiffusionPipeline.save_pretrained`)."""
        if self.accelerator.is_main_process:
            self.sd_pipeline.save_pretrained(str(save_directory))
            base = getattr(getattr(self.sd_pipeline, "sd_pipeline", None), "name_or_path", None)
            write_card_for_run(save_directory, self, "DDPO", self.run_dir, base)

    _save_pretrained = save_pretrained  # TRL v0.7.1's name

    def save_checkpoint(self) -> Path:
        """``run_dir/checkpoint-<epochs done>``: the pipeline's trained weights, then the optimizer, step counters,
        per-prompt stats and RNG states (`replayrl.checkpoints`, no pickle), then the completeness marker; older
        checkpoints beyond ``num_checkpoint_limit`` are removed after that."""
        path = self.run_dir / f"checkpoint-{self.first_epoch}"
        if self.accelerator.is_main_process:
            path.mkdir(parents=True, exist_ok=True)
            self.sd_pipeline.save_checkpoint(path)
        state = {
            "epoch": self.first_epoch,
            "global_step": self.global_step,
            "optimizer": self.optimizer.state_dict(),
            "stat_tracker": self.stat_tracker.state_dict() if self.stat_tracker else None,
            "rng": rng_state(self.generator),
        }
        save_extra_state(path, f"{STATE_NAME}_rank{self.accelerator.process_index}", state)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            mark_checkpoint(path, self.config, self.accelerator.num_processes)
            self._rotate_checkpoints()
        return path

    def _rotate_checkpoints(self) -> None:
        import shutil

        limit = self.config.num_checkpoint_limit
        old = checkpoints_in(self.run_dir)
        for path in old[: max(0, len(old) - limit)] if limit else []:
            shutil.rmtree(path)

    def _resume(self, resume_from: str) -> None:
        path = latest_checkpoint(resume_from)
        self.sd_pipeline.load_checkpoint(path)
        accelerator = self.accelerator
        state = load_checkpoint_state(
            path, STATE_NAME, accelerator.process_index, accelerator.num_processes, self.config, self.generator
        )
        self.optimizer.load_state_dict(state["optimizer"])
        if self.stat_tracker is not None and state["stat_tracker"] is not None:
            self.stat_tracker.load_state_dict(state["stat_tracker"])
        self.first_epoch, self.global_step = int(state["epoch"]), int(state["global_step"])
        logger.info("resumed from %s: epoch %d, step %d", path, self.first_epoch, self.global_step)

    def __del__(self):
        executor = getattr(self, "executor", None)
        if executor is not None:
            executor.shutdown(wait=False)


def collate_samples(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """`DDPOTrainer._generate_samples`' per-batch samples joined along the batch dimension (prompts: one list)."""
    return {
        k: [p for b in batches for p in b[k]] if k == "prompts" else torch.cat([b[k] for b in batches])
        for k in batches[0]
    }
