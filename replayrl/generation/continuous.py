"""transformers' continuous batching (`model.generate_batch`: a paged KV cache, requests scheduled token by token
instead of a padded batch), TRL 1.16's ``use_transformers_continuous_batching`` (``use_transformers_paged``, its
deprecated name). Off by default; it pays on a GPU with many completions of uneven lengths. On a CPU it works but
the cache is sized from ``transformers_continuous_batching_config`` (give ``num_blocks`` / ``max_batch_tokens`` there:
the default ``max_memory_percent`` sizes it from free memory)."""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import GenerationConfig

from replayrl.generation.base import GenerationOutput, pad_completions, unpad_prompts
from replayrl.generation.hf import sampling_mode


def continuous_batching_config(settings: dict | None):
    """transformers' `ContinuousBatchingConfig` from TRL's ``transformers_continuous_batching_config`` dict, with
    TRL's training-aware default ``max_memory_percent=0.5`` (transformers' 0.9 leaves little for the backward)."""
    try:
        from transformers.generation import ContinuousBatchingConfig
    except ImportError as err:  # transformers 5.2 (the declared floor) has generate_batch but not this config
        import transformers

        raise ImportError(
            f"use_transformers_continuous_batching needs transformers' ContinuousBatchingConfig, which transformers "
            f"{transformers.__version__} lacks: upgrade transformers, or leave continuous batching off."
        ) from err

    kwargs = dict(settings or {})
    kwargs.setdefault("max_memory_percent", 0.5)
    return ContinuousBatchingConfig(**kwargs)


class ContinuousBatchingBackend:
    """`GenerationBackend` over ``generate_batch`` with the policy itself: nothing to sync, no engine log-probs."""

    def __init__(self, model, generation_config: GenerationConfig, settings: dict | None = None):
        self.model = model
        self.generation_config = generation_config
        self.cb_config = continuous_batching_config(settings)

    @torch.no_grad()
    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor) -> GenerationOutput:
        prompts = unpad_prompts(prompt_ids, prompt_mask)
        with sampling_mode(self.model):
            outputs = self.model.generate_batch(
                prompts,
                generation_config=self.generation_config,
                continuous_batching_config=self.cb_config,
                progress_bar=False,
            )
        results = list(outputs.values())  # in the order of the prompts
        if len(results) != len(prompts) or any(r.error is not None for r in results):
            errors = [r.error for r in results if r.error is not None]
            raise RuntimeError(f"generate_batch returned {len(results)} of {len(prompts)} completions ({errors})")
        config = self.generation_config
        eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
        tokens = [r.generated_tokens for r in results]
        return pad_completions(tokens, None, eos, config.pad_token_id, config.max_new_tokens, prompt_ids.device)

    def sync_weights(self, model) -> None:
        self.model = model

    def close(self) -> None:
        pass
