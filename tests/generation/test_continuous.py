"""transformers' continuous batching (`use_transformers_continuous_batching`, TRL's `use_transformers_paged`) on a
CPU, with a small paged cache."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.generation.continuous import ContinuousBatchingBackend
from replayrl.generation.hf import HFGenerationBackend
from tests.conftest import tiny_args

SMALL_CACHE = {"num_blocks": 16, "max_batch_tokens": 256, "use_async_batching": False}


def test_greedy_completions_equal_generate_row_by_row_in_prompt_order(model, tokenizer):
    """Prompts of different lengths, left-padded as the trainer passes them: greedy continuous batching gives each
    row the completion that the padded `generate` gives it (same tokens, EOS cut, mask, truncation)."""
    texts = ["what is 2+3?", "hi", "name a colour of the sky at noon", "7*6="]
    enc = tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")
    config = GenerationConfig(
        max_new_tokens=12, do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    want = HFGenerationBackend(model, config).generate(enc["input_ids"], enc["attention_mask"])
    got = ContinuousBatchingBackend(model, config, SMALL_CACHE).generate(enc["input_ids"], enc["attention_mask"])
    assert torch.equal(got.completion_ids, want.completion_ids[:, : got.completion_ids.shape[1]])
    assert torch.equal(got.completion_mask, want.completion_mask[:, : got.completion_mask.shape[1]])
    assert torch.equal(got.truncated, want.truncated)
    assert model.training  # restored after generation


def test_grpo_trains_with_use_transformers_paged(model, tokenizer, dataset, tmp_path):
    """TRL's deprecated `use_transformers_paged` turns continuous batching on (with a FutureWarning, as TRL); the
    trainer generates every group with `generate_batch` and trains on those completions."""
    with pytest.warns(FutureWarning, match="use_transformers_paged"):
        args = tiny_args(
            GRPOConfig, tmp_path, use_transformers_paged=True, transformers_continuous_batching_config=SMALL_CACHE
        )
    assert args.use_transformers_continuous_batching
    reward = lambda completions, **kw: [float(len(c)) for c in completions]  # noqa: E731
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    assert isinstance(trainer.generator, ContinuousBatchingBackend)
    calls = []
    generate_batch = model.generate_batch

    def counted(prompts, **kwargs):
        calls.append(len(prompts))
        return generate_batch(prompts, **kwargs)

    model.generate_batch = counted  # the real method, counted
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    assert calls and all(n == args.per_device_train_batch_size for n in calls)
    logged = [r for r in trainer.state.log_history if "completions/max_length" in r]
    assert len(logged) == 2 and all(0 < r["completions/max_length"] <= args.max_completion_length for r in logged)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
