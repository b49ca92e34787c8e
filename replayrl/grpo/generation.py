"""GRPO's side of the generation backends: a batch's generation (`generate_batch`, or the user's `rollout_func`,
grpo/rollout_func.py) into one `Generated` record, when to sync the engine's weights, and the correction of the
trainer/engine log-prob mismatch (algos.engine_is_weights) with its metrics. Kept out of trainer.py so the
trainer reads as the algorithm."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from replayrl import algos
from replayrl.data.prompts import tokenize_prompts
from replayrl.data.vision import (
    VisionInputs,
    encode_prompts,
    prepare_multimodal_messages,
    row_images,
    text_tokenizer,
)
from replayrl.grpo.rollout import fit_width
from replayrl.models.sharding import gathered_parameters, generation_context


@dataclass
class Generated:
    """A generated batch before scoring. Shapes: (N, P) left-padded prompts, (N, C) right-padded completions.
    `engine_logps`: the sampler's log-probs of its tokens (vLLM, or a rollout_func's `logprobs`); `tool_mask`: 0 on
    tokens the model did not generate (tool results, or a rollout_func's `env_mask`); `messages`: the multi-turn
    completions of the tool loop; `extra`: a rollout_func's extra fields, for the reward functions; `policy_version`:
    set by the asynchronous worker (grpo/async_rollouts.py)."""

    prompt_ids: Tensor
    prompt_mask: Tensor
    completion_ids: Tensor
    completion_mask: Tensor
    truncated: Tensor  # (N,) bool
    engine_logps: Tensor | None = None
    tool_mask: Tensor | None = None
    messages: list | None = None
    extra: dict = field(default_factory=dict)
    vision: VisionInputs | None = None
    policy_version: int | None = None  # the optimizer step of the weights that sampled it (None: the current one)

    def version(self, current_step: int) -> int:
        """The policy version of the rows: the asynchronous producer's, else the current optimizer step."""
        return current_step if self.policy_version is None else self.policy_version


def prompt_images(inputs: list[dict], prompts: list, group_size: int) -> tuple[list, list[list] | None]:
    """The prompts with one image placeholder per image (TRL's `prepare_multimodal_messages`) and the images of
    each group of ``group_size`` rows (loaded as PIL RGB; an empty list for a row without images, which trains as
    text among the others, as TRL), or the prompts unchanged and None when no row has images. Every row of a group
    shares its prompt (the sampler repeats it), so images are loaded once per group."""
    if not any(x.get("image") is not None or x.get("images") for x in inputs):
        return prompts, None
    images = [row_images(inputs[g * group_size]) or [] for g in range(len(inputs) // group_size)]
    prompts = [prepare_multimodal_messages(p, len(images[i // group_size])) for i, p in enumerate(prompts)]
    return prompts, images


def generate_batch(
    trainer, texts: list[str], mode: str, add_special_tokens: bool = False, images: list[list] | None = None
) -> Generated:
    """Tokenize the prompt texts (plain-text prompts with the tokenizer's special tokens, `tokenize_prompts`; with
    `images`, one list per group, the processor once per group, `encode_prompts`) and sample one completion per row
    with the generation backend (+ tool calls)."""
    device, vision = trainer.accelerator.device, None
    if images is None:
        prompt_ids, prompt_mask = tokenize_prompts(  # a processor's tokenizer: text rows only here
            text_tokenizer(trainer.processing_class), texts, trainer.args.max_prompt_length, add_special_tokens
        )
    else:
        prompt_ids, prompt_mask, vision = encode_prompts(
            trainer.processing_class, texts, images, trainer._group_size(mode), trainer.args.max_prompt_length
        )
        vision = vision.to(device)
    prompt_ids, prompt_mask = trainer._pad_to_multiple(prompt_ids, prompt_mask, "left")
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    start = time.perf_counter()
    with generation_context(trainer) as policy:  # ZeRO-3: gathered once per batch (ds3_gather_for_generation)
        sync_generator(trainer, policy)
        model_inputs = {} if vision is None else vision.model_kwargs(prompt_mask)
        out = trainer.generator.generate(prompt_ids, prompt_mask, **model_inputs)
        trainer._metrics[mode]["timing/generation"].append(time.perf_counter() - start)
        gen = Generated(prompt_ids, prompt_mask, out.completion_ids, out.completion_mask, out.truncated, out.logps)
        gen.vision = vision
        return finish_generation(trainer, gen, mode)  # the tool loop generates too


def finish_generation(trainer, gen: Generated, mode: str) -> Generated:
    """Run the tool loop (when the trainer has tools) and pad the completion fields to `pad_to_multiple_of`."""
    tool_mask, engine_logps, messages = gen.tool_mask, gen.engine_logps, None
    ids, mask, truncated = gen.completion_ids, gen.completion_mask, gen.truncated
    if trainer.tools:
        ids, mask, truncated, tool_mask, messages = trainer._call_tools(
            gen.prompt_ids, gen.prompt_mask, ids, mask, truncated, mode
        )
        engine_logps = None  # the engine's log-probs cover its own tokens only: none after tool turns (transformers)
    if tool_mask is not None:
        tool_mask = trainer._pad_to_multiple(tool_mask, tool_mask, "right", pad_id=1)[0]
    ids, mask = trainer._pad_to_multiple(ids, mask, "right")
    gen.completion_ids, gen.completion_mask, gen.truncated, gen.tool_mask = ids, mask, truncated, tool_mask
    gen.engine_logps, gen.messages = fit_width(engine_logps, ids.shape[1]), messages
    return gen


def sync_generator(trainer, policy) -> None:
    """Give the backend the policy's weights when they changed since the last sync (an optimizer step ran), and
    only then: at most one sync per optimizer step that precedes a generation."""
    step = trainer.state.global_step
    if trainer._synced_step == step:
        return
    start = time.perf_counter()
    with gathered_parameters(policy.parameters() if trainer.args.use_vllm else []):  # ZeRO-3: whole weights out
        trainer.generator.sync_weights(policy)
    trainer._synced_step = step
    if trainer.args.use_vllm:
        trainer._metrics["train"]["timing/weight_sync"].append(time.perf_counter() - start)


def engine_correction(trainer, mode: str, batch, behaviour: Tensor, is_weights: Tensor | None) -> Tensor | None:
    """Multiply `is_weights` by the truncated importance weights pi_trainer / pi_engine of the engine-sampled
    tokens (TRL's `vllm_importance_sampling_*`), and log the mismatch. `behaviour`: (N, C) the trainer's
    log-probs of the behaviour policy. Rows without engine log-probs (transformers backend) are untouched."""
    args = trainer.args
    if batch.engine_logps is None or not args.use_vllm:
        return is_weights
    mask = batch.completion_mask
    weights = algos.engine_is_weights(
        behaviour,
        batch.engine_logps,
        mask,
        args.vllm_importance_sampling_mode,
        args.vllm_importance_sampling_clip_max,
        args.vllm_importance_sampling_clip_min,
    )
    _log_mismatch(trainer, mode, behaviour, batch.engine_logps, mask, weights)
    if not args.vllm_importance_sampling_correction:
        return is_weights
    return weights if is_weights is None else is_weights * weights


def _log_mismatch(trainer, mode: str, behaviour: Tensor, engine: Tensor, mask: Tensor, weights: Tensor) -> None:
    """sampling/sampling_logp_difference/{mean,max} and sampling/importance_sampling_ratio/{min,mean,max}, over
    every process; a sequence-level ratio counts once per row."""
    diff = algos.logp_difference(behaviour, engine, mask)
    known = mask.bool() & ~engine.isnan()
    ratios = weights[:, 0][known.any(1)] if weights.shape[1] == 1 else weights[known]
    trainer._reduce_means(
        mode,
        {
            "sampling/sampling_logp_difference/mean": (diff.sum(), torch.tensor(diff.numel())),
            "sampling/importance_sampling_ratio/mean": (ratios.sum(), torch.tensor(ratios.numel())),
        },
    )
    empty = float("-inf")  # every process joins the gather, even one with nothing to report
    local = torch.tensor(
        [float(diff.max()), float(-ratios.min()), float(ratios.max())] if diff.numel() else [empty] * 3,
        device=trainer.accelerator.device,
    )
    extremes = trainer.accelerator.gather(local.unsqueeze(0)).amax(0).tolist()
    if extremes[0] == empty:
        return
    metrics = trainer._metrics[mode]
    metrics["sampling/sampling_logp_difference/max"].append(extremes[0])
    metrics["sampling/importance_sampling_ratio/min"].append(-extremes[1])
    metrics["sampling/importance_sampling_ratio/max"].append(extremes[2])
