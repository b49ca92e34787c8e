"""Offline tiny Qwen2 model + character tokenizer for tests, examples, benchmarks and the CLI default job.

Nothing here touches a model hub: the vocabulary is fixed and the weights are random (seeded).
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

PAD, EOS, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
BOS = "<s>"  # only in build_tokenizer(bos=True)
SPECIAL_TOKENS = [PAD, EOS, IM_START, IM_END]
CHARS = string.ascii_letters + string.digits + string.punctuation + " \n\t"
# Qwen2's pre-tokenizer split; copied so the saved tokenizer.json matches what Qwen2Tokenizer rebuilds on load.
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _byte_level(char: str) -> str:
    """The ByteLevel alphabet symbol for `char` (e.g. space -> 'Ġ'), as the tokenizers library maps it."""
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(char)[0][0]


def build_tokenizer(bos: bool = False) -> PreTrainedTokenizerFast:
    """Character-level tokenizer (~100 ids) with a ChatML template; decode(encode(text)) == text for ASCII text.

    `bos=True`: a Llama-style variant, in memory only (saved, it would reload as Qwen2Tokenizer without it): a BOS
    `<s>` (the last id) that `tokenizer(text)` puts first and the chat template starts with, the same ids otherwise.

    It is a byte-level BPE with an empty merge list (so one token per character) using Qwen2's exact pipeline.
    Why not WordLevel: transformers 5 loads any `model_type="qwen2"` checkpoint with Qwen2Tokenizer, which
    rebuilds a ByteLevel BPE from the vocab and ignores the saved pipeline; matching it keeps save/load lossless.
    Characters outside the vocabulary (non-ASCII, control chars other than newline/tab) are dropped.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + [_byte_level(c) for c in CHARS])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    # Registered as added tokens so "<|im_start|>" in text maps to one id instead of 12 characters.
    backend.add_special_tokens(SPECIAL_TOKENS)
    if bos:
        backend.add_special_tokens([BOS])
        special = [(BOS, backend.token_to_id(BOS))]
        backend.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                               special_tokens=special)  # fmt: skip
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS if bos else None,
        pad_token=PAD,
        eos_token=EOS,
        additional_special_tokens=[IM_START, IM_END],
        padding_side="left",
        chat_template="{{ bos_token }}" + CHAT_TEMPLATE if bos else CHAT_TEMPLATE,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )


def _config(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    **extra,
) -> Qwen2Config:
    """Qwen2Config sized for CPU tests, with special-token ids taken from the tokenizer."""
    # Qwen2 has no BOS token; like the real Qwen checkpoints, reuse EOS as bos_token_id.
    bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=bos_id,
        eos_token_id=tokenizer.eos_token_id,
        **extra,
    )


@contextmanager
def whole_construction() -> Iterator[None]:
    """Build with whole (unpartitioned) weights even while a DeepSpeed ZeRO-3 config is live (transformers then
    constructs models inside `deepspeed.zero.Init`, and Qwen2's weight init indexes the empty partitioned
    embedding): a tiny model is seeded on every process alike and partitioned when the trainer prepares it."""
    from transformers.integrations import deepspeed as hf_deepspeed

    saved = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = saved


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Qwen2ForCausalLM:
    """Randomly initialised tiny Qwen2ForCausalLM; same seed gives identical weights."""
    config = _config(tokenizer, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size)
    # fork_rng keeps the caller's global RNG stream untouched by model construction.
    with torch.random.fork_rng(devices=[]), whole_construction():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model = model.to(dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    return model


def build_tiny_sequence_classifier(
    tokenizer: PreTrainedTokenizerFast, seed: int = 0, **config_kwargs
) -> Qwen2ForSequenceClassification:
    """Tiny Qwen2 scalar head (num_labels=1), usable as a reward model; config_kwargs as in build_tiny_model."""
    config = _config(tokenizer, num_labels=1, **config_kwargs)
    with torch.random.fork_rng(devices=[]), whole_construction():
        torch.manual_seed(seed)
        return Qwen2ForSequenceClassification(config)


def save_tiny(path: str | Path, **model_kwargs) -> str:
    """Write a tiny model + tokenizer to `path` (loadable with Auto*.from_pretrained) and return the path."""
    path = Path(path)
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, **model_kwargs).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _make_example(rng: random.Random) -> tuple[str, str, str]:
    """One (prompt, answer, task) triple; prompts are 5-30 characters."""
    task = rng.choice(["count", "add", "repeat"])
    if task == "count":
        start, length = rng.randint(0, 20), rng.randint(1, 6)
        nums = list(range(start, start + length))
        return "Count: " + " ".join(map(str, nums)), str(nums[-1] + 1), task
    if task == "add":
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return f"Add: {a}+{b}=", str(a + b), task
    word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 20)))
    return f"Repeat: {word}", word, task


def prompt_dataset(n: int = 32, conversational: bool = False, seed: int = 0) -> Dataset:
    """Deterministic toy prompts with `prompt`, `answer` and `task` columns (prompt as chat messages if asked)."""
    rng = random.Random(seed)
    rows = [_make_example(rng) for _ in range(n)]
    prompts: list = [p for p, _, _ in rows]
    if conversational:
        prompts = [[{"role": "user", "content": p}] for p in prompts]
    return Dataset.from_dict({"prompt": prompts, "answer": [a for _, a, _ in rows], "task": [t for _, _, t in rows]})
