"""Generation backends without vLLM: the transformers backend through the interface, the padding helper, and
the error a user without vLLM gets (the vLLM tests themselves are in tests/vllm, run in .venv-vllm)."""

import importlib.util

import pytest
import torch

from replayrl.generation import build_backend
from replayrl.generation.base import GenerationBackend, hf_state_dict, pad_completions, unpad_prompts
from replayrl.generation.hf import build_generation_config, generate_completions
from replayrl.grpo import GRPOConfig
from tests.conftest import tiny_moe_model

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_use_vllm_without_vllm_is_one_line_error(tmp_path):
    with pytest.raises(ImportError) as err:
        GRPOConfig(output_dir=str(tmp_path), use_vllm=True, per_device_train_batch_size=8)
    message = str(err.value)
    assert "pip install replayrl[vllm]" in message and "\n" not in message
    assert isinstance(err.value, ValueError)  # the CLI reports config ValueErrors in one line


def test_bad_vllm_options_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode"):
        GRPOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_importance_sampling_mode="tis")
    with pytest.raises(ValueError, match="vllm_mode"):
        GRPOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_mode="remote")


def test_hf_backend_matches_generate_completions(tmp_path, model, tokenizer):
    args = GRPOConfig(output_dir=str(tmp_path), max_completion_length=5, temperature=1.0)
    config = build_generation_config(args, tokenizer)
    backend = build_backend(args, model, tokenizer, config)
    assert isinstance(backend, GenerationBackend)
    batch = tokenizer(["ab", "hello"], return_tensors="pt", padding=True)
    torch.manual_seed(0)
    out = backend.generate(batch.input_ids, batch.attention_mask)
    torch.manual_seed(0)
    ids, mask, truncated = generate_completions(model, batch.input_ids, batch.attention_mask, config)
    assert torch.equal(out.completion_ids, ids) and torch.equal(out.completion_mask, mask)
    assert torch.equal(out.truncated, truncated) and out.logps is None


def test_pad_completions_cuts_at_first_eos():
    out = pad_completions([[5, 2, 7], [4, 4, 4, 4]], [[-0.5, -0.1, -3.0], [-1.0] * 4], [2], 0, 3)
    assert out.completion_ids.tolist() == [[5, 2, 0], [4, 4, 4]]
    assert out.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert out.truncated.tolist() == [False, True]
    assert out.logps[0, :2].tolist() == pytest.approx([-0.5, -0.1]) and out.logps[0, 2].isnan()
    assert unpad_prompts(torch.tensor([[0, 3, 4], [5, 6, 7]]), torch.tensor([[0, 1, 1], [1, 1, 1]])) == [
        [3, 4],
        [5, 6, 7],
    ]


def test_hf_state_dict_of_merged_peft_model_has_plain_names(model):
    from peft import LoraConfig, get_peft_model

    plain = dict(model.state_dict())
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], lora_dropout=0.0))
    names = dict(hf_state_dict(peft_model))
    assert names.keys() == plain.keys()


def test_kv_cache_budget_is_what_the_batch_needs_within_the_ram_share(tokenizer):
    from replayrl.generation.vllm_colocate import MIN_KV_CACHE_BYTES, kv_cache_budget
    from replayrl.models.tiny import build_tiny_model

    config = build_tiny_model(tokenizer, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2).config
    # 2 (K, V) * 4 layers * 2 kv heads * 64 head_dim * 4 bytes = 4096 bytes per token; x 128 tokens x 64 seqs x 2
    assert kv_cache_budget(config, torch.float32, 128, 64, fraction=0.3) == 4096 * 128 * 64 * 2
    assert kv_cache_budget(config, torch.float32, 16, 1, fraction=0.3) == MIN_KV_CACHE_BYTES
    assert kv_cache_budget(config, torch.float32, 4096, 4096, fraction=1e-6) == MIN_KV_CACHE_BYTES


def test_sampling_kwargs_map_trl_fields(tmp_path):
    from replayrl.generation.vllm_colocate import sampling_kwargs

    args = GRPOConfig(output_dir=str(tmp_path), temperature=0.7, top_k=None, min_p=None, repetition_penalty=1.1)
    kwargs = sampling_kwargs(args, 12)
    assert kwargs["top_k"] == -1 and kwargs["min_p"] == 0.0 and kwargs["max_tokens"] == 12
    assert kwargs["temperature"] == 0.7 and kwargs["repetition_penalty"] == 1.1 and kwargs["logprobs"] == 0


def test_top_k_none_turns_top_k_filtering_off(tmp_path, tokenizer):
    """transformers fills a missing top_k with 50: None must reach it as 0 (off), as the field's help says."""
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, report_to="none")
    assert build_generation_config(GRPOConfig(**base, top_k=None), tokenizer).top_k == 0
    assert build_generation_config(GRPOConfig(**base, top_k=5), tokenizer).top_k == 5


def test_moe_model_generates_with_router_logits_on(tokenizer):
    """A config with output_router_logits=True (GRPO's MoE aux loss) generates: the router logits are off while
    decoding (transformers 5.17's decoding steps otherwise fail on a mask of 4 rows against 48 routed tokens),
    the completions are those of the model without them, and the config keeps its setting for training."""
    model = tiny_moe_model(tokenizer)
    gen = build_generation_config(GRPOConfig(output_dir="unused", max_completion_length=4, temperature=1.0), tokenizer)
    batch = tokenizer(["ab", "hello there"], return_tensors="pt", padding=True)
    torch.manual_seed(1)
    ids, mask, _ = generate_completions(model, batch.input_ids, batch.attention_mask, gen)
    assert model.config.output_router_logits is True
    model.config.output_router_logits = False
    torch.manual_seed(1)
    plain_ids, plain_mask, _ = generate_completions(model, batch.input_ids, batch.attention_mask, gen)
    assert torch.equal(ids, plain_ids) and torch.equal(mask, plain_mask)


def _decoding_widths(model) -> list[int]:
    widths: list[int] = []
    model.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    return widths


def test_generation_keeps_its_kv_cache_when_the_trainer_turned_use_cache_off(model, tokenizer):
    """transformers' Trainer sets `config.use_cache = args.use_cache` (False), and a model built from that config
    (the async worker's copy) gets a generation config without a cache: every decoding step would re-run the whole
    sequence. The trainer's generation config and the worker's model both keep the cache: after the prompt's forward,
    each step feeds one new token."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from replayrl.generation.async_worker import _build_model, _generate

    config = model.config.__class__.from_dict(model.config.to_dict())
    config.use_cache = False
    batch = tokenizer(["ab", "hello"], return_tensors="pt", padding=True)
    trainer_side = AutoModelForCausalLM.from_config(config)
    assert trainer_side.generation_config.use_cache is False  # what transformers would decode with by default
    widths = _decoding_widths(trainer_side)
    gen = build_generation_config(GRPOConfig(output_dir="unused", max_completion_length=5, temperature=1.0), tokenizer)
    generate_completions(trainer_side, batch.input_ids, batch.attention_mask, gen)
    assert widths[0] == batch.input_ids.shape[1] and widths[1:] == [1] * (len(widths) - 1) and len(widths) > 1

    worker_side = _build_model(config, torch.float32)
    widths = _decoding_widths(worker_side)
    ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    plain = GenerationConfig(max_new_tokens=5, do_sample=True, **ids).to_dict()
    _generate(worker_side, batch.input_ids, batch.attention_mask, plain, seed=0)
    assert widths[0] == batch.input_ids.shape[1] and widths[1:] == [1] * (len(widths) - 1) and len(widths) > 1
