"""Local stand-ins and rewrite rules for TRL v0.7.1's own test files (`scripts/trl_tests.py` applies them).

TRL v0.7.1's `tests/test_ppo_trainer.py`, `tests/test_modeling_value_head.py` and `tests/test_ddpo_trainer.py`
(in the `trl==0.7.1` sdist: `pip download --no-deps --no-binary :all: trl==0.7.1`) load the hub's 2023 test
models and tie themselves to the hub in ways TRL 1.16's files do not. What is replaced here, never an assertion:
  - models: `trl-internal-testing/dummy-GPT2-correct-vocab` and `from_pretrained("gpt2")` (GPT-2, 2 layers),
    `tiny-BloomForCausalLM-correct-vocab`, `tiny-T5ForConditionalGeneration-correct-vocab`, whose tokenizer
    (`word_tokenizer`) is byte-level BPE with merges for the words the tests encode, so "This morning I went to the "
    is 7 tokens as on the hub; `tiny-random-<Architecture>` (7 causal LMs, 18 encoder-decoders, `GPT2Model` and
    `T5Model`) from configs; `hf-internal-testing/tiny-stable-diffusion-torch` as replayrl's tiny Stable Diffusion
    with that model's shapes (latents 4x64x64, CLIP text states 77x32);
  - imports: `trl.core` -> `replayrl.core`; `.testing_constants` and `huggingface_hub`'s `HfApi, HfFolder,
    delete_repo` -> offline stand-ins in the shim (no token is saved, no hub call is made);
  - the environment: accelerate's `zero_grad()` as of 2023 (`set_to_none=False`, changed to True in accelerate
    0.28, whereupon TRL patched the same `param.grad is not None` checks in its own files: TRL PR #1422), as an
    autouse fixture of each PPO file, so those checks test which parameters received gradients.
"""

from __future__ import annotations

import re
from pathlib import Path

# Names the TRL 1.16 rule (`trl_tests.HUB_MODEL`, `tiny-*`) does not catch: matched here with their quotes.
EXTRA_NAMES = re.compile(
    r"""(["'])(trl-internal-testing/dummy-GPT2-correct-vocab|hf-internal-testing/tiny-stable-diffusion-torch)\1"""
)
GPT2_HUB = re.compile(r"""(from_pretrained\(\s*)(["'])gpt2\2""")
# Words of the texts the PPO tests encode; each becomes one token (GPT-2's byte-level form, "Ġ" = leading space).
WORDS = ["This", " morning", " I", " went", " to", " the", "this", " is", " a", " test", " another", ",", " longer"]
SIZES = dict(hidden_size=32, n_embd=32, num_hidden_layers=2, n_layer=2, num_layers=2, num_attention_heads=4)
SIZES.update(n_head=4, num_heads=4, intermediate_size=64, ffn_dim=64, word_embed_proj_dim=32, rotary_dim=4)
# Encoder-decoder sizes: each key set where the architecture's config has it.
SEQ2SEQ_SIZES = dict(
    d_model=32, hidden_size=32, encoder_layers=1, decoder_layers=1, num_layers=1, num_decoder_layers=1,
    num_encoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, num_heads=2,
    num_encoder_attention_heads=2, num_decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, d_ff=32,
    d_kv=16, max_position_embeddings=512, max_encoder_position_embeddings=512, max_decoder_position_embeddings=512,
    attention_window=8, num_experts=2, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1,
    attention_type="original_full", block_size=8, num_global_tokens=4, ngram=2, encoder_layerdrop=0.0,
    decoder_layerdrop=0.0, langs=["en", "de"],
)  # fmt: skip
CAUSAL = {
    "CodeGenForCausalLM": "codegen",
    "CodeGenForCausalLM-sharded": "codegen",
    "GPTJForCausalLM": "gptj",
    "GPTNeoForCausalLM": "gpt_neo",
    "GPTNeoXForCausalLM": "gpt_neox",
    "OPTForCausalLM": "opt",
    "BloomForCausalLM": "bloom",
    "GPT2LMHeadModel": "gpt2",
}
BASE_MODELS = {"GPT2Model": "gpt2", "T5Model": "t5"}  # loaded with AutoModel (no LM head): the refusal tests
SEQ2SEQ = {
    "BartForConditionalGeneration": "bart",
    "BigBirdPegasusForConditionalGeneration": "bigbird_pegasus",
    "BlenderbotForConditionalGeneration": "blenderbot",
    "BlenderbotSmallForConditionalGeneration": "blenderbot-small",
    "FSMTForConditionalGeneration": "fsmt",
    "LEDForConditionalGeneration": "led",
    "LongT5ForConditionalGeneration": "longt5",
    "M2M100ForConditionalGeneration": "m2m_100",
    "MarianMTModel": "marian",
    "MBartForConditionalGeneration": "mbart",
    "MT5ForConditionalGeneration": "mt5",
    "MvpForConditionalGeneration": "mvp",
    "PegasusForConditionalGeneration": "pegasus",
    "PegasusXForConditionalGeneration": "pegasus_x",
    "PLBartForConditionalGeneration": "plbart",
    "ProphetNetForConditionalGeneration": "prophetnet",
    "SwitchTransformersForConditionalGeneration": "switch_transformers",
    "T5ForConditionalGeneration": "t5",
}
VOCAB = 128  # the value-head tests feed ids 1..10
CORRECT_VOCAB = {  # 2023 PPO test models: (model_type, tokenizer padding side)
    "dummy-GPT2-correct-vocab": ("gpt2", "left"),
    "gpt2": ("gpt2", "left"),
    "tiny-BloomForCausalLM-correct-vocab": ("bloom", "right"),
    "tiny-T5ForConditionalGeneration-correct-vocab": ("t5", "right"),
}
SD_NAME = "hf-internal-testing/tiny-stable-diffusion-torch"


def extra_names(text: str) -> set[str]:
    """The v0.7.1-era hub names in `text` that `trl_tests.HUB_MODEL` does not match."""
    names = {m.group(2) for m in EXTRA_NAMES.finditer(text)}
    return names | ({"gpt2"} if GPT2_HUB.search(text) else set())


def rewrite(source: str, models: dict[str, str]) -> str:
    """`source` with the v0.7.1-era names replaced by their local paths and its hub imports made offline."""
    source = EXTRA_NAMES.sub(lambda m: repr(models[m.group(2)]) if m.group(2) in models else m.group(0), source)
    if "gpt2" in models:
        source = GPT2_HUB.sub(lambda m: m.group(1) + repr(models["gpt2"]), source)
    source = re.sub(r"^from trl\.core import", "from replayrl.core import", source, flags=re.M)
    source = re.sub(r"^from \.testing_constants import", "from .testing_utils import", source, flags=re.M)
    if "HfFolder" in source:
        source = re.sub(r"^from huggingface_hub import", "from trl_tests.testing_utils import", source, flags=re.M)
    if re.search(r"^from (trl|replayrl) import .*PPOTrainer", source, flags=re.M):  # before or after trl_tests' rules
        source += "\n\nfrom trl_tests.testing_utils import zero_grad_as_in_2023  # noqa: E402, F401\n"
    return source


def build(name: str, out: Path) -> str | None:
    """The local stand-in for hub model `name` (a `tiny-*` short name or an `extra_names` name), saved under
    `out`; None when this module has none."""
    short = name.removeprefix("trl-internal-testing/")
    if name == SD_NAME:
        return _build_sd(out / "tiny-stable-diffusion-torch")
    if short in CORRECT_VOCAB:
        return _build_correct_vocab(short, out / short)
    arch = short.removeprefix("tiny-random-")
    if arch in CAUSAL or arch in BASE_MODELS:
        return _build_tiny(arch, CAUSAL.get(arch) or BASE_MODELS[arch], out / short, causal=arch in CAUSAL)
    if arch in SEQ2SEQ:
        return _build_tiny(arch, SEQ2SEQ[arch], out / short, causal=False, seq2seq=True)
    return None


def word_tokenizer(padding_side: str = "left"):
    """GPT-2-style byte-level BPE: the 256 byte symbols, merges that make each of `WORDS` one token, and
    `<|endoftext|>` (EOS, BOS, pad). Other text encodes one byte per token."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(alphabet)}
    symbols = dict(enumerate(_gpt2_byte_symbols()))  # byte -> its byte-level symbol
    merges = []
    for word in WORDS:
        parts = ["".join(symbols[b] for b in ch.encode()) for ch in word]
        merged = parts[0]
        for part in parts[1:]:
            if merged + part not in vocab:
                merges.append((merged, part))
                vocab[merged + part] = len(vocab)
            merged += part
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        padding_side=padding_side,
        model_max_length=512,
    )


def _gpt2_byte_symbols() -> list[str]:
    """GPT-2's byte -> symbol table, in byte order: printable bytes as themselves, the others from chr(256) on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = iter(chr(256 + n) for n in range(256))
    return [chr(b) if b in printable else next(others) for b in range(256)]


def _build_correct_vocab(short: str, path: Path) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    model_type, side = CORRECT_VOCAB[short]
    tokenizer = word_tokenizer(side)
    eos = tokenizer.eos_token_id
    ids = dict(vocab_size=len(tokenizer), bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    if model_type == "t5":
        ids["decoder_start_token_id"] = eos
        config = AutoConfig.for_model("t5", d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4, **ids)
    else:
        config = AutoConfig.for_model(model_type, **_known(model_type, SIZES), n_positions=512, **ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = (AutoModelForSeq2SeqLM if model_type == "t5" else AutoModelForCausalLM).from_config(config)
    model.generation_config.update(pad_token_id=eos, eos_token_id=eos)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _known(model_type: str, sizes: dict) -> dict:
    """The entries of `sizes` that `model_type`'s config has (its default config's keys)."""
    from transformers import AutoConfig

    keys = set(AutoConfig.for_model(model_type).to_dict())
    return {k: v for k, v in sizes.items() if k in keys}


def _build_tiny(arch: str, model_type: str, path: Path, causal: bool, seq2seq: bool = False) -> str:
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    # the hub's tiny-random causal LMs have 5 layers (v0.7.1's reference-model test reads layer 4)
    layers = dict(num_hidden_layers=5, n_layer=5, num_layers=5)
    sizes = _known(model_type, SEQ2SEQ_SIZES if seq2seq else {**SIZES, **layers})
    if model_type == "fsmt":
        sizes.update(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)
    if model_type == "gpt_neo":
        sizes.update(attention_types=[[["global", "local"], 1]], num_layers=2)
    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, **sizes)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_eos_token_id"):
        if isinstance(getattr(config, key, None), int) and getattr(config, key) >= VOCAB:
            setattr(config, key, 0)  # defaults of large vocabularies (Marian's pad 58100)
    if seq2seq and getattr(config, "decoder_start_token_id", None) is None:  # in the hub configs (T5: the pad id)
        config.decoder_start_token_id = config.pad_token_id if config.pad_token_id is not None else 0
    cls = AutoModelForCausalLM if causal else AutoModelForSeq2SeqLM if seq2seq else AutoModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = cls.from_config(config)
    if seq2seq and model.generation_config.decoder_start_token_id is None:
        model.generation_config.decoder_start_token_id = config.decoder_start_token_id
    model.save_pretrained(path, max_shard_size="20KB" if arch.endswith("-sharded") else "5GB")
    return str(path)


def _build_sd(path: Path) -> str:
    """replayrl's tiny Stable Diffusion with hf-internal-testing/tiny-stable-diffusion-torch's shapes: UNet
    sample size 64 (latents 4x64x64), a CLIP text encoder of width 32 over 77 positions."""
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel

    from replayrl.models.tiny_diffusion import build_clip_tokenizer, build_tiny_sd_pipeline

    pipe = build_tiny_sd_pipeline(seed=0, image_size=128)
    tokenizer = build_clip_tokenizer(max_length=77)
    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        pipe.text_encoder, pipe.tokenizer = CLIPTextModel(config), tokenizer
    pipe.register_modules(text_encoder=pipe.text_encoder, tokenizer=tokenizer)
    pipe.save_pretrained(path)
    return str(path)
