"""Tests for the offline tiny model/tokenizer factory."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from replayrl.models.tiny import (
    build_tiny_model,
    build_tiny_sequence_classifier,
    build_tokenizer,
    prompt_dataset,
    save_tiny,
)

ROUND_TRIP_TEXTS = [
    "Count: 3 4 5",
    "Hello  world!\n  x = {a}\n\n",
    "  leading and trailing  ",
    "tabs\tand\nnewlines\n",
    "it's I'LL we've 12345 6.5e3",
    "~!@#$%^&*()_+`-=[]\\{}|;':\",./<>?",
    "\\boxed{\\frac{1}{2}}",
    "",
]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return build_tokenizer()


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_tokenizer_round_trip(tok, text):
    ids = tok(text).input_ids
    assert tok.decode(ids) == text
    # Character level: one id per character (no BOS/EOS added).
    assert len(ids) == len(text)


def test_tokenizer_vocab_and_special_tokens(tok):
    assert 90 <= len(tok) <= 110
    assert tok.pad_token == "<|pad|>" and tok.eos_token == "<|endoftext|>"
    assert tok.pad_token_id != tok.eos_token_id
    assert tok.padding_side == "left"
    for special in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>"]:
        ids = tok(special).input_ids
        assert len(ids) == 1 and tok.decode(ids) == special
    assert tok.decode(tok("<|im_start|>hi<|im_end|>").input_ids, skip_special_tokens=True) == "hi"


def test_tokenizer_left_padding(tok):
    batch = tok(["ab", "abcd"], padding=True)
    assert batch.input_ids[0][:2] == [tok.pad_token_id] * 2
    assert batch.attention_mask == [[0, 0, 1, 1], [1, 1, 1, 1]]


def test_chat_template(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add: 1+2="}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAdd: 1+2=<|im_end|>\n<|im_start|>assistant\n"
    )
    no_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert no_prompt == text.removesuffix("<|im_start|>assistant\n")
    assert tok.decode(tok(text).input_ids) == text


def test_save_load_round_trip(tmp_path, tok):
    path = save_tiny(tmp_path / "tiny", hidden_size=32, seed=3)
    assert path == str(tmp_path / "tiny")
    model = AutoModelForCausalLM.from_pretrained(path)
    loaded_tok = AutoTokenizer.from_pretrained(path)
    expected = build_tiny_model(tok, hidden_size=32, seed=3)
    for (name, a), b in zip(expected.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    # transformers 5 reloads qwen2 checkpoints as Qwen2Tokenizer; encoding/decoding must not change.
    assert loaded_tok.chat_template == tok.chat_template
    assert loaded_tok.padding_side == "left"
    assert (loaded_tok.pad_token_id, loaded_tok.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    for text in ROUND_TRIP_TEXTS:
        assert loaded_tok(text).input_ids == tok(text).input_ids
        assert loaded_tok.decode(loaded_tok(text).input_ids) == text
    messages = [{"role": "user", "content": "hi"}]
    assert loaded_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    )


def test_model_config(tok):
    model = build_tiny_model(tok)
    cfg = model.config
    assert cfg.vocab_size == len(tok)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (64, 2, 4, 2)
    assert cfg.pad_token_id == tok.pad_token_id and cfg.eos_token_id == tok.eos_token_id
    assert cfg.max_position_embeddings == 512
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id


def test_forward_and_generate(tok):
    model = build_tiny_model(tok).eval()
    batch = tok(["Count: 1 2", "Add: 3+4="], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
        out = model.generate(**batch, max_new_tokens=4, do_sample=False)
    assert logits.shape == (2, batch.input_ids.shape[1], len(tok))
    assert out.shape[0] == 2 and batch.input_ids.shape[1] < out.shape[1] <= batch.input_ids.shape[1] + 4
    assert torch.equal(out[:, : batch.input_ids.shape[1]], batch.input_ids)


def test_deterministic_weights(tok):
    a, b, c = build_tiny_model(tok, seed=1), build_tiny_model(tok, seed=1), build_tiny_model(tok, seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_model_build_does_not_touch_global_rng(tok):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tok, seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_dtype(tok):
    model = build_tiny_model(tok, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_sequence_classifier(tok):
    model = build_tiny_sequence_classifier(tok, seed=0).eval()
    assert model.config.num_labels == 1 and model.config.pad_token_id == tok.pad_token_id
    batch = tok(["short", "a longer text"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, 1)
    again = build_tiny_sequence_classifier(tok, seed=0)
    assert all(torch.equal(x, y) for x, y in zip(model.state_dict().values(), again.state_dict().values()))


def test_prompt_dataset_plain():
    ds = prompt_dataset(n=40, seed=0)
    assert len(ds) == 40 and set(ds.column_names) == {"prompt", "answer", "task"}
    assert all(isinstance(p, str) and 5 <= len(p) <= 30 for p in ds["prompt"])
    assert len(set(map(len, ds["prompt"]))) > 3  # varied lengths
    assert set(ds["task"]) <= {"count", "add", "repeat"}
    assert all(isinstance(a, str) and a for a in ds["answer"])
    assert ds["prompt"] == prompt_dataset(n=40, seed=0)["prompt"]
    assert ds["prompt"] != prompt_dataset(n=40, seed=1)["prompt"]


def test_prompt_dataset_answers_are_correct():
    for row in prompt_dataset(n=60, seed=5):
        prompt, answer = row["prompt"], row["answer"]
        if row["task"] == "add":
            a, b = prompt.removeprefix("Add: ").removesuffix("=").split("+")
            assert int(answer) == int(a) + int(b)
        elif row["task"] == "count":
            assert int(answer) == int(prompt.split()[-1]) + 1
        else:
            assert prompt == f"Repeat: {answer}"


def test_prompt_dataset_conversational(tok):
    plain, conv = prompt_dataset(n=8), prompt_dataset(n=8, conversational=True)
    assert conv["answer"] == plain["answer"] and conv["task"] == plain["task"]
    for text, messages in zip(plain["prompt"], conv["prompt"]):
        assert messages == [{"role": "user", "content": text}]
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert rendered.endswith("<|im_start|>assistant\n")
