"""vLLM colocate engine against transformers, in float32 on CPU: greedy tokens equal `generate`, sampled-token
log-probs equal the policy's, and stay equal after training steps + a weight sync (tied and untied lm_head,
LoRA merged for the sync)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from replayrl import algos
from replayrl.generation.hf import completion_mask_from_eos
from replayrl.grpo import GRPOConfig

TOLERANCE = 1e-4  # nats; measured ~1e-6


def _args(tmp_path, **overrides):
    kwargs = dict(
        output_dir=str(tmp_path),
        use_vllm=True,
        max_completion_length=12,
        max_prompt_length=32,
        temperature=0.7,
        top_k=None,
        per_device_train_batch_size=4,
        num_generations=4,
        use_cpu=True,
        report_to="none",
        seed=0,
    )
    kwargs.update(overrides)
    return GRPOConfig(**kwargs)


def _load(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)


def _prompts(tokenizer):
    texts = ["Count: 1 2 3", "hello", "ab", "Repeat: xyz", "7+8=", "q"]
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    return batch.input_ids, batch.attention_mask


@torch.no_grad()
def _policy_logps(model, prompt_ids, prompt_mask, out, temperature):
    """The trainer's log-probs (N, C) of the engine's completion tokens, as GRPOTrainer computes them."""
    input_ids = torch.cat([prompt_ids, out.completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, out.completion_mask], dim=1)
    width = out.completion_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=width + 1).logits[:, :-1]
    return algos.token_logps_and_entropy(logits, out.completion_ids, temperature, False)[0]


def _gap(model, prompts, out, temperature) -> float:
    trainer = _policy_logps(model, *prompts, out, temperature)
    return algos.logp_difference(trainer, out.logps, out.completion_mask).max().item()


def _train(model, tokenizer, steps=3, lr=3e-2):
    """A few Adam steps that move every trainable weight (lm_head/embedding included)."""
    model.train()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    batch = tokenizer(["Count: 1 2 3 4 5 6", "Repeat: abcabc"], return_tensors="pt", padding=True)
    for _ in range(steps):
        loss = model(**batch, labels=batch.input_ids.masked_fill(batch.attention_mask == 0, -100)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


@pytest.fixture
def engine():
    backends = []

    def start(args, model, tokenizer):
        from replayrl.generation.vllm_colocate import VLLMColocateBackend

        backends.append(VLLMColocateBackend.from_config(args, model, tokenizer))
        return backends[-1]

    yield start
    for backend in backends:
        backend.close()


def _greedy(backend, tokenizer, max_tokens):
    import vllm

    eos = tokenizer.eos_token_id
    backend.sampling_params = vllm.SamplingParams(
        temperature=0.0, max_tokens=max_tokens, logprobs=0, stop_token_ids=[eos], detokenize=False
    )


@torch.no_grad()
def _hf_greedy(model, tokenizer, prompt_ids, prompt_mask, max_tokens):
    out = model.generate(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        do_sample=False,
        max_new_tokens=max_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )[:, prompt_ids.shape[1] :]
    mask, _ = completion_mask_from_eos(out, tokenizer.eos_token_id)
    return [row[m.bool()].tolist() for row, m in zip(out, mask)]


def _engine_rows(out):
    return [row[m.bool()].tolist() for row, m in zip(out.completion_ids, out.completion_mask)]


def test_greedy_equals_transformers_and_logps_match(tmp_path, engine, vllm_model_dir):
    model, tokenizer = _load(vllm_model_dir)
    prompts = _prompts(tokenizer)
    backend = engine(_args(tmp_path), model, tokenizer)
    _greedy(backend, tokenizer, 12)
    out = backend.generate(*prompts)
    assert _engine_rows(out) == _hf_greedy(model, tokenizer, *prompts, 12)
    assert _gap(model, prompts, out, temperature=1.0) < TOLERANCE

    # Make EOS the greedy choice wherever the most frequent token was (tied: its embedding row), sync, compare
    # again: both stop at EOS at the same place.
    frequent = torch.cat([out.completion_ids[out.completion_mask.bool()]]).mode().values.item()
    with torch.no_grad():
        embed = model.get_input_embeddings().weight
        embed[tokenizer.eos_token_id] = 1.5 * embed[frequent]
    backend.sync_weights(model)
    out = backend.generate(*prompts)
    assert not out.truncated.all(), "no row stopped at EOS"
    assert _engine_rows(out) == _hf_greedy(model, tokenizer, *prompts, 12)
    assert _gap(model, prompts, out, temperature=1.0) < TOLERANCE


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_sampled_logps_match_policy_after_training_and_sync(tmp_path, engine, tied, request):
    path = request.getfixturevalue("vllm_model_dir" if tied else "vllm_untied_model_dir")
    model, tokenizer = _load(path)
    assert (model.lm_head.weight is model.get_input_embeddings().weight) == tied
    prompts = _prompts(tokenizer)
    backend = engine(_args(tmp_path), model, tokenizer)
    assert _gap(model, prompts, backend.generate(*prompts), 0.7) < TOLERANCE

    _train(model, tokenizer)
    stale = _gap(model, prompts, backend.generate(*prompts), 0.7)
    assert stale > 1e-2, f"training did not move the policy enough to test the sync ({stale})"
    backend.sync_weights(model)
    for _ in range(2):  # twice: the prefix cache must not serve the old weights' KV
        assert _gap(model, prompts, backend.generate(*prompts), 0.7) < TOLERANCE


def test_lora_is_merged_for_the_sync_and_unmerged_after(tmp_path, engine, vllm_model_dir):
    from peft import LoraConfig, get_peft_model

    base, tokenizer = _load(vllm_model_dir)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    prompts = _prompts(tokenizer)
    backend = engine(_args(tmp_path), model, tokenizer)
    _train(model, tokenizer, lr=5e-2)
    before = _policy_logps(model, *prompts, backend.generate(*prompts), 0.7)
    backend.sync_weights(model)
    out = backend.generate(*prompts)
    assert _gap(model, prompts, out, 0.7) < TOLERANCE
    assert not any(getattr(m, "merged", False) for m in model.modules()), "adapter left merged"
    assert before.shape[0] == out.completion_ids.shape[0]


def test_a_passed_adapter_syncs_without_its_frozen_reference_copy(tmp_path, engine, vllm_untied_model_dir):
    """A PeftModel passed already wrapped gets a frozen "ref" copy (models.peft_reference); vLLM must receive the
    trained adapter merged, with the trained `modules_to_save` copy of lm_head, never the frozen one."""
    from peft import LoraConfig, get_peft_model

    from replayrl.models.peft_reference import add_reference_adapter

    base, tokenizer = _load(vllm_untied_model_dir)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])
    model = get_peft_model(base, config)
    add_reference_adapter(model)
    prompts = _prompts(tokenizer)
    backend = engine(_args(tmp_path), model, tokenizer)
    _train(model, tokenizer, lr=5e-2)
    stale = _gap(model, prompts, backend.generate(*prompts), 0.7)
    assert stale > 1e-2, f"training did not move the policy enough to test the sync ({stale})"
    backend.sync_weights(model)
    assert _gap(model, prompts, backend.generate(*prompts), 0.7) < TOLERANCE
    assert model.active_adapter == "default"
