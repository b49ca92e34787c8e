"""Does DDPO raise the reward on the built-in tiny pipeline? Paired runs per seed, and the gradient's noise.

For each seed, two runs share every random draw: one maximises the centre-brightness reward, one minimises it
(the reward negated). Their first update directions are exactly opposite, so the gap between them (measured
with the un-negated reward) is what training did, with the sampling noise paired out. `--grad-cos` also
reports the cosine between policy gradients from independent batches at the initial weights, and between
each and the pathwise gradient (backpropagated through the sampler): near 0 means the policy-gradient estimate
is mostly noise at that batch size.

    python benchmarks/ddpo_reward.py --seeds 0 1 2 3 --epochs 6 --lr 3e-5
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time

import torch

from replayrl.ddpo import DDPOConfig, DDPOTrainer, DefaultDDPOStableDiffusionPipeline
from replayrl.ddpo.rewards import centre_brightness
from replayrl.ddpo.trainer import collate_samples
from replayrl.models.tiny_diffusion import build_tiny_sd_pipeline


def _trainer(seed: int, args, reward) -> DDPOTrainer:
    config = DDPOConfig(
        logdir=tempfile.mkdtemp(),
        seed=seed,
        num_epochs=args.epochs,
        sample_num_steps=args.steps,
        sample_batch_size=args.batch,
        sample_num_batches_per_epoch=1,
        train_batch_size=args.batch,
        train_learning_rate=args.lr,
        mixed_precision="no",
        save_freq=0,
    )
    pipe = DefaultDDPOStableDiffusionPipeline(build_tiny_sd_pipeline(seed), use_lora=args.lora)
    return DDPOTrainer(config, reward, lambda: (random.choice(["a cat", "a dog"]), {}), pipe)


def paired_run(seed: int, args) -> dict:
    curves = {}
    for sign in (1, -1):
        measured = []

        def reward(images, prompts, metadata, sign=sign, measured=measured):
            value = centre_brightness(images, prompts, metadata)[0]
            measured.append(value.mean().item())
            return sign * value, {}

        _trainer(seed, args, reward).train()
        curves["up" if sign == 1 else "down"] = measured
    gap = [u - d for u, d in zip(curves["up"], curves["down"])]
    return {"seed": seed, **curves, "gap": gap, "mean_gap_after_first": sum(gap[1:]) / max(1, len(gap) - 1)}


def _flat_grad(trainer) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in trainer.trainable_layers]).clone()


def pathwise_gradient(trainer, args, batches: int = 4) -> torch.Tensor:
    """The reward's gradient by backpropagation through the sampling chain (reparameterised, low variance):
    the direction the policy gradient estimates."""
    from replayrl.ddpo.pipeline import decode_latents, encode_prompts, guided_noise_pred

    pipe, g, grads = trainer.sd_pipeline, torch.Generator().manual_seed(12345), []
    embeds = encode_prompts(pipe.sd_pipeline, ["a cat"] * args.batch, "cpu").detach()
    negative = trainer.neg_prompt_embed.expand(args.batch, -1, -1)
    for _ in range(batches):
        trainer.optimizer.zero_grad()
        pipe.scheduler.set_timesteps(args.steps)
        x = torch.randn(args.batch, 4, 8, 8, generator=g)
        for t in pipe.scheduler.timesteps:
            eps = guided_noise_pred(pipe.unet, x, t, embeds, negative, 5.0)
            x = pipe.scheduler_step(eps, t, x, eta=1.0, generator=g).latents
        centre_brightness(decode_latents(pipe.sd_pipeline, x), None, None)[0].mean().backward()
        grads.append(_flat_grad(trainer))
    return torch.stack(grads).mean(0)


def gradient_cosines(seed: int, args, batches: int = 4) -> dict[str, list[float]]:
    """Cosines between policy-gradient estimates of independent batches, and of each with the pathwise
    gradient (all at the initial weights)."""
    trainer = _trainer(seed, args, centre_brightness)
    pathwise = pathwise_gradient(trainer, args)
    grads = []
    for _ in range(batches):
        batches, data = trainer._generate_samples(1, args.batch)
        samples = collate_samples(batches)
        samples["advantages"] = trainer._advantages(trainer._collect_rewards(data), samples.pop("prompts"))
        trainer.optimizer.zero_grad()
        embeds = torch.cat([trainer.neg_prompt_embed.expand(args.batch, -1, -1), samples["prompt_embeds"]])
        for j in range(args.steps):
            keys = ("latents", "timesteps", "next_latents", "log_probs")
            loss, _, _ = trainer.calculate_loss(*(samples[k][:, j] for k in keys), samples["advantages"], embeds)
            loss.backward()
        grads.append(-_flat_grad(trainer))  # the loss's descent direction: up the reward
    cos = torch.nn.functional.cosine_similarity
    pairs = [(i, j) for i in range(batches) for j in range(i + 1, batches)]
    return {
        "between_batches": [cos(grads[i], grads[j], dim=0).item() for i, j in pairs],
        "with_pathwise": [cos(grad, pathwise, dim=0).item() for grad in grads],
    }


def _cos_text(cosines: dict[str, list[float]]) -> str:
    return "".join(f"; cos {name} " + ", ".join(f"{c:+.2f}" for c in values) for name, values in cosines.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter instead of the whole UNet")
    parser.add_argument("--grad-cos", action="store_true")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    for seed in args.seeds:
        start = time.perf_counter()
        result = paired_run(seed, args)
        if args.grad_cos:
            result["grad_cos"] = gradient_cosines(seed, args)
        result["seconds"] = time.perf_counter() - start
        results.append(result)
        up, gap = result["up"], result["gap"]
        print(
            f"seed {seed}: reward {up[0]:.4f} -> {up[-1]:.4f}; up - down per epoch "
            + " ".join(f"{g:+.4f}" for g in gap)
            + (_cos_text(result["grad_cos"]) if args.grad_cos else "")
            + f" ({result['seconds']:.0f} s)",
            flush=True,
        )
    positive = sum(r["mean_gap_after_first"] > 0 for r in results)
    print(f"{positive}/{len(results)} seeds: maximising beat minimising on average after the first epoch")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
