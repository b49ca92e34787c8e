"""Generation with transformers `generate`: left-padded prompt ids -> G sampled completions each.

`generate_completions` takes token ids and returns completion ids, their mask and which rows were truncated;
`HFGenerationBackend` puts it behind the `GenerationBackend` interface (replayrl.generation.base).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor
from transformers import GenerationConfig

from replayrl.generation.base import GenerationOutput
from replayrl.models.sharding import needs_synced_gpus


def build_generation_config(args, tokenizer) -> GenerationConfig:
    eos = tokenizer.eos_token_id
    return GenerationConfig(
        max_new_tokens=args.max_completion_length,
        do_sample=True,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=0 if args.top_k is None else args.top_k,  # None: off (transformers would fill in its 50)
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        cache_implementation=args.cache_implementation,
        use_cache=True,  # whatever the model's config says: transformers' Trainer sets it to `args.use_cache` (False)
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
        eos_token_id=eos,
    )


def completion_mask_from_eos(completion_ids: Tensor, eos_token_id: int | list[int]) -> tuple[Tensor, Tensor]:
    """Mask (N, C) of real tokens: everything up to and including the first EOS; and `truncated` (N,) for
    rows with no EOS."""
    eos_ids = torch.as_tensor(eos_token_id, device=completion_ids.device).reshape(-1)
    is_eos = torch.isin(completion_ids, eos_ids)
    has_eos = is_eos.any(dim=1)
    width = completion_ids.shape[1]
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, width, dtype=torch.long))
    positions = torch.arange(width, device=completion_ids.device).expand_as(completion_ids)
    return (positions <= first_eos.unsqueeze(1)).long(), ~has_eos


@contextmanager
def sampling_mode(model):
    """The model as every generation path samples with it, restored afterwards: eval mode (no dropout; it also lets
    generate keep its KV cache under gradient checkpointing) and no MoE router logits even when the config asks for
    them (the aux loss is a training term, and transformers 5.17's decoding steps pass the whole (N, past + 1)
    attention mask with the router logits of the new token only, so `load_balancing_loss_func` fails: 4 rows
    against 48)."""
    was_training = model.training
    configs = [getattr(model, "config", None)]
    if configs[0] is not None and hasattr(configs[0], "get_text_config"):
        configs.append(configs[0].get_text_config())
    saved = [(c, c.output_router_logits) for c in configs if getattr(c, "output_router_logits", False)]
    for config, _ in saved:
        config.output_router_logits = False
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
        for config, value in saved:
            config.output_router_logits = value


@torch.no_grad()
def generate_completions(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    generation_config: GenerationConfig,
    logits_processor=None,
    **model_inputs,
) -> tuple[Tensor, Tensor, Tensor]:
    """Sample one completion per row. Returns completion ids (N, C), mask (N, C) and truncated (N,).
    `logits_processor`: extra processors for `generate` (the async worker records its log-probs with one);
    `model_inputs`: the model's extra inputs for the prompts (a VLM's ``pixel_values``, ...)."""
    with sampling_mode(model):
        out = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            generation_config=generation_config,
            synced_gpus=needs_synced_gpus(model) or None,  # sharded weights: every process joins every forward
            logits_processor=logits_processor,
            **model_inputs,
        )
    completion_ids = out[:, prompt_ids.shape[1] :]
    mask, truncated = completion_mask_from_eos(completion_ids, generation_config.eos_token_id)
    completion_ids = completion_ids.masked_fill(mask == 0, generation_config.pad_token_id)
    return completion_ids, mask, truncated


class HFGenerationBackend:
    """`GenerationBackend` over transformers `generate` with the policy itself: nothing to sync, no engine
    log-probs (the trainer's own log-probs are the behaviour log-probs)."""

    def __init__(self, model, generation_config: GenerationConfig):
        self.model = model
        self.generation_config = generation_config

    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor, **model_inputs) -> GenerationOutput:
        """`model_inputs`: a VLM's image inputs for the rows (`VisionInputs.model_kwargs`)."""
        ids, mask, truncated = generate_completions(
            self.model, prompt_ids, prompt_mask, self.generation_config, **model_inputs
        )
        return GenerationOutput(completion_ids=ids, completion_mask=mask, truncated=truncated)

    def sync_weights(self, model) -> None:
        self.model = model

    def close(self) -> None:
        pass
