"""Offline tiny vision-language stand-ins (random weights) with a locally made processor, for tests, examples and the
built-in VLM job: Qwen2-VL, Qwen2.5-VL, LLaVA and Gemma 3 (`FAMILIES`), LLaVA-NeXT, Qwen3-VL, Qwen3.5, Idefics2/3 and
Gemma 4 (`MORE_FAMILIES`), each the real transformers class built from a config.

The tokenizer is `replayrl.models.tiny`'s character-level one plus the family's image special tokens, with a chat
template that renders TRL's multimodal messages (``{"type": "image"}`` / ``{"type": "text", ...}`` parts) the way
the family's own template does. The processors use the PIL image processors (no torchvision: see
docs/vlm.md) and leave out the video part. Images are small: 56x56 for Qwen2-VL / Qwen2.5-VL and 64x64 for
Qwen3-VL (4 image tokens each), 28x28 for LLaVA and Gemma 3 (4 image tokens), and LLaVA-NeXT's any-resolution
tiles of 28x28 (a base view and one tile: 4 + 6 tokens). Gemma 4's image processor resizes every image to its
smallest budget, 70 soft tokens (64 for a square image), whatever its size. LLaVA and LLaVA-NeXT take their features
from the vision tower's second-to-last layer (``vision_feature_layer=-2``, as the published checkpoints and TRL's test
models), so its last layer and post-layernorm get no gradient.
"""

from __future__ import annotations

from typing import Literal

import torch
from transformers import PreTrainedTokenizerFast

from replayrl.models.processors import without_video
from replayrl.models.tiny import build_tokenizer

Family = Literal["qwen2_vl", "qwen2_5_vl", "llava", "gemma3", "llava_next", "qwen3_vl", "qwen3_5", "qwen3_5_moe",
                 "idefics2", "idefics3", "gemma4"]  # fmt: skip
FAMILIES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl", "llava", "gemma3")
MORE_FAMILIES: tuple[str, ...] = ("llava_next", "qwen3_vl", "qwen3_5", "qwen3_5_moe", "idefics2", "idefics3", "gemma4")
# Idefics3 (SmolVLM's architecture; SmolVLM's own processor needs the num2words package): an image expands to
# <fake_token_around_image><global-img><image>...<fake_token_around_image>; split images' row/column tokens too.
_IDEFICS_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"] + [
    f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)
]
_QWEN = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe")
_QWEN_MARKUP = "<|vision_start|><|image_pad|><|vision_end|>"
_QWEN_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
# Gemma 4's tokenizer: its named multimodal tokens (the processor reads them by name; it checks the audio ones even
# without audio) and its turn markers; "<|video|>" is the token Gemma4Processor adds itself.
_GEMMA4_NAMED = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
                 "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}  # fmt: skip
_GEMMA4_TURN = ("<|turn>", "<turn|>")

# What one {"type": "image"} part renders to in each family's chat template (the processor expands it).
_IMAGE_MARKUP = {
    "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_vl": _QWEN_MARKUP,
    "qwen3_5": _QWEN_MARKUP,
    "qwen3_5_moe": _QWEN_MARKUP,
    "llava": "<image>",
    "llava_next": "<image>",
    "gemma3": "<start_of_image>",
    "idefics2": "<image>",
    "idefics3": "<image>",
    "gemma4": "<|image|>",  # Gemma4Processor expands it to <|image> + its soft tokens + <image|>
}
_IMAGE_TOKENS = {
    "qwen2_vl": ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"],
    "qwen2_5_vl": ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"],
    "qwen3_vl": _QWEN_TOKENS,
    "qwen3_5": _QWEN_TOKENS,
    "qwen3_5_moe": _QWEN_TOKENS,
    "llava": ["<image>"],
    "llava_next": ["<image>"],
    "gemma3": ["<start_of_image>", "<image_soft_token>", "<end_of_image>"],
    "idefics2": _IDEFICS_TOKENS[:3],
    "idefics3": _IDEFICS_TOKENS,
    "gemma4": [*_GEMMA4_NAMED.values(), "<|video|>", *_GEMMA4_TURN],
}
IMAGE_SIZE = {"qwen2_vl": 56, "qwen2_5_vl": 56, "qwen3_vl": 64, "qwen3_5": 64, "qwen3_5_moe": 64, "llava": 28,
              "llava_next": 28, "gemma3": 28, "idefics2": 28, "idefics3": 28, "gemma4": 32}  # fmt: skip


def _chat_template(image_markup: str, turn: tuple[str, str] = ("<|im_start|>", "<|im_end|>"),
                   assistant: str = "assistant") -> str:  # fmt: skip
    """ChatML over string or multimodal-list contents (the tiny tokenizer's template, extended), with
    ``{% generation %}`` marks around each assistant turn (its text and end marker) for assistant-only loss.
    ``turn`` / ``assistant``: other turn markers and the assistant's role name (Gemma 4: ``<|turn>model`` ...
    ``<turn|>``)."""
    start, end = turn
    role = "message['role']"
    if assistant != "assistant":
        role = f"('{assistant}' if {role} == 'assistant' else {role})"
    return (
        "{% macro render(content) %}{% if content is string %}{{ content }}{% else %}"
        "{% for part in content %}"
        f"{{% if part['type'] == 'image' %}}{{{{ '{image_markup}' }}}}"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{% endmacro %}"
        f"{{% for message in messages %}}{{{{ '{start}' + {role} + '\n' }}}}"
        "{% if message['role'] == 'assistant' %}"
        f"{{% generation %}}{{{{ render(message['content']) }}}}{{{{ '{end}' }}}}{{% endgeneration %}}{{{{ '\n' }}}}"
        f"{{% else %}}{{{{ render(message['content']) }}}}{{{{ '{end}' + '\n' }}}}{{% endif %}}{{% endfor %}}"
        f"{{% if add_generation_prompt %}}{{{{ '{start}{assistant}\n' }}}}{{% endif %}}"
    )


def build_vlm_tokenizer(family: Family) -> PreTrainedTokenizerFast:
    """The tiny character tokenizer with `family`'s image tokens added as special tokens and a multimodal template."""
    _check_family(family)
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(_IMAGE_TOKENS[family], special_tokens=True)
    tokenizer.chat_template = _chat_template(_IMAGE_MARKUP[family])
    if family == "gemma4":  # Gemma 4's turns (<|turn>user ... <turn|>, the assistant is "model"); a turn ends it
        tokenizer.chat_template = _chat_template(_IMAGE_MARKUP[family], _GEMMA4_TURN, "model")
        tokenizer.eos_token = _GEMMA4_TURN[1]
        tokenizer._set_model_specific_special_tokens(special_tokens=dict(_GEMMA4_NAMED))
    if family == "gemma3":  # Gemma3Processor reads these named tokens (saved and reloaded with the tokenizer)
        named = dict(zip(("boi_token", "image_token", "eoi_token"), _IMAGE_TOKENS["gemma3"]))
        tokenizer._set_model_specific_special_tokens(special_tokens=named)  # what `extra_special_tokens={...}` does
    return tokenizer


def _pil_image_processor(prefix: str):
    """transformers' PIL image processor of a family: `<prefix>ImageProcessorPil` (newer releases), else the
    numpy/PIL `<prefix>ImageProcessor` of older ones (transformers 5.2, the floor); neither needs torchvision."""
    import transformers

    return getattr(transformers, f"{prefix}ImageProcessorPil", None) or getattr(transformers, f"{prefix}ImageProcessor")


def build_tiny_processor(family: Family):
    """The family's transformers processor over the tiny tokenizer and a PIL image processor sized for the stand-in."""
    tokenizer = build_vlm_tokenizer(family)
    template = tokenizer.chat_template
    size = IMAGE_SIZE[family]
    if family in _QWEN:
        image_processor = _pil_image_processor("Qwen2VL")(
            size={"shortest_edge": size * size, "longest_edge": size * size}, patch_size=size // 4, merge_size=2
        )
        import transformers

        names = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor"}  # Qwen3-VL's for the others
        cls = getattr(transformers, names.get(family, "Qwen3VLProcessor"))
        return without_video(cls)(image_processor=image_processor, tokenizer=tokenizer, chat_template=template)
    if family in ("llava", "llava_next"):
        from transformers import LlavaNextProcessor, LlavaProcessor

        crop = {"height": size, "width": size}
        if family == "llava":
            image_processor = _pil_image_processor("Llava")(size={"shortest_edge": size}, crop_size=crop)
        else:  # any resolution: the image resized to its best grid of 28x28 tiles ([28, 56]: two), plus a base view
            image_processor = _pil_image_processor("LlavaNext")(
                size={"shortest_edge": size}, crop_size=crop, image_grid_pinpoints=[[size, 2 * size]]
            )
        return (LlavaProcessor if family == "llava" else LlavaNextProcessor)(
            image_processor=image_processor,
            tokenizer=tokenizer,
            patch_size=14,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,  # CLIP's CLS, dropped by the "default" strategy
            chat_template=template,
        )
    if family == "idefics2":  # one 28x28 view per image, resampled to 4 latents (4 image tokens)
        from transformers import Idefics2Processor

        image_processor = _pil_image_processor("Idefics2")(
            do_image_splitting=False, size={"shortest_edge": size, "longest_edge": size}
        )
        return Idefics2Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4,
                                 chat_template=template)  # fmt: skip
    if family == "idefics3":  # one 28x28 view per image (no splitting): 1 image token after the pixel shuffle
        from transformers import Idefics3Processor

        image_processor = _pil_image_processor("Idefics3")(
            do_image_splitting=False, size={"longest_edge": size}, max_image_size={"longest_edge": size}
        )
        return Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=1,
                                 chat_template=template)  # fmt: skip
    if family == "gemma4":
        return _gemma4_processor(tokenizer, template)
    from transformers import Gemma3Processor

    image_processor = _pil_image_processor("Gemma3")(size={"height": size, "width": size})
    return Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, chat_template=template,
                           image_seq_length=4)  # fmt: skip


def _gemma4_processor(tokenizer, template: str):
    """Gemma4Processor from its real parts: the audio feature extractor (unused by images, but a part the processor
    requires), the PIL image processor at its smallest budget (70 soft tokens: any image is resized to fill it, a
    32x32 one to 64x64 pixels, 16x16 patches of 4 pixels pooled 2x2 into 64 image tokens) and no video processor
    (torchvision, `without_video`)."""
    from transformers import Gemma4AudioFeatureExtractor, Gemma4Processor

    image_processor = _pil_image_processor("Gemma4")(patch_size=4, pooling_kernel_size=2, max_soft_tokens=70)
    return without_video(Gemma4Processor)(feature_extractor=Gemma4AudioFeatureExtractor(),
                                          image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                                          chat_template=template, image_seq_length=70)  # fmt: skip


def _text_kwargs(tokenizer, hidden_size: int, num_layers: int) -> dict:
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def _qwen_vision_tokens(ids) -> dict[str, int]:
    """The Qwen-VL families' image, video and vision-span token ids."""
    names = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"}
    names |= {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}
    return {key: ids(token) for key, token in names.items()}


def _qwen_config(family: Family, text: dict, ids, hidden_size: int, num_layers: int):
    """The Qwen-VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 dense and MoE): M-RoPE text, tiny vision tower."""
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig

        vision = dict(depth=1, embed_dim=32, hidden_size=hidden_size, num_heads=2, mlp_ratio=2)
        return Qwen2VLConfig(
            text_config={**text, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}},
            vision_config=vision,
            **_qwen_vision_tokens(ids),
            tie_word_embeddings=True,
        )
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig

        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden_size,
                      window_size=56, fullatt_block_indexes=[0])  # fmt: skip
        return Qwen2_5_VLConfig(
            text_config={**text, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}},
            vision_config=vision,
            **_qwen_vision_tokens(ids),
            tie_word_embeddings=True,
        )
    if family in ("qwen3_vl", "qwen3_5", "qwen3_5_moe"):
        import transformers

        rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden_size,
                      patch_size=16, num_position_embeddings=16)  # fmt: skip
        text = {**text, "head_dim": hidden_size // 4, "rope_parameters": rope}
        if family == "qwen3_vl":
            vision["deepstack_visual_indexes"] = [0]
        else:  # Qwen3.5: gated delta-net (linear attention) layers before a full-attention one; the MoE variant
            rope["partial_rotary_factor"] = 1.0
            text.update(layer_types=["linear_attention"] * (num_layers - 1) + ["full_attention"],
                        linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                        linear_num_value_heads=4)  # fmt: skip
        if family == "qwen3_5_moe":
            text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        shared_expert_intermediate_size=32)  # fmt: skip
        names = {"qwen3_vl": "Qwen3VLConfig", "qwen3_5": "Qwen3_5Config", "qwen3_5_moe": "Qwen3_5MoeConfig"}
        cls = getattr(transformers, names[family])
        return cls(
            text_config=text,
            vision_config=vision,
            **_qwen_vision_tokens(ids),
            tie_word_embeddings=True,
        )
    raise ValueError(f"not a Qwen-VL family: {family!r}")


def _config(family: Family, tokenizer, hidden_size: int, num_layers: int):
    text = _text_kwargs(tokenizer, hidden_size, num_layers)
    ids = tokenizer.convert_tokens_to_ids
    if family.startswith("qwen"):
        return _qwen_config(family, text, ids, hidden_size, num_layers)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=IMAGE_SIZE[family], patch_size=14)  # fmt: skip
    if family in ("llava", "llava_next"):
        from transformers import LlavaConfig, LlavaNextConfig

        common = dict(vision_config={"model_type": "clip_vision_model", **vision},
                      text_config={"model_type": "llama", **text}, vision_feature_select_strategy="default",
                      vision_feature_layer=-2, tie_word_embeddings=True)  # fmt: skip
        if family == "llava":
            return LlavaConfig(image_token_id=ids("<image>"), **common)
        size = IMAGE_SIZE[family]
        return LlavaNextConfig(image_token_index=ids("<image>"), image_grid_pinpoints=[[size, 2 * size]],
                               image_seq_length=4, **common)  # fmt: skip
    if family == "idefics2":
        from transformers import Idefics2Config

        perceiver = dict(hidden_size=hidden_size, resampler_n_latents=4, resampler_depth=1, resampler_n_heads=2,
                         resampler_head_dim=16, num_key_value_heads=1)  # fmt: skip
        return Idefics2Config(
            vision_config={**vision, "num_hidden_layers": 1},
            perceiver_config=perceiver,
            text_config={"model_type": "mistral", **text},
            image_token_id=ids("<image>"),
            tie_word_embeddings=True,
        )
    if family == "idefics3":
        from transformers import Idefics3Config

        return Idefics3Config(
            vision_config={**vision, "num_hidden_layers": 1},
            text_config={"model_type": "llama", **text},
            image_token_id=ids("<image>"),
            scale_factor=2,
            tie_word_embeddings=True,
        )
    if family == "gemma4":
        return _gemma4_config(tokenizer, text)
    from transformers import Gemma3Config

    text = {**text, "head_dim": 16, "sliding_window": 64, "query_pre_attn_scalar": 16}
    return Gemma3Config(
        text_config=text,
        vision_config={"model_type": "siglip_vision_model", "vision_use_head": False, **vision},
        mm_tokens_per_image=4,
        boi_token_index=ids("<start_of_image>"),
        eoi_token_index=ids("<end_of_image>"),
        image_token_index=ids("<image_soft_token>"),
        tie_word_embeddings=True,
    )


def _gemma4_config(tokenizer, text: dict):
    """Gemma 4 as its E-series shape, tiny: per-layer embeddings (8 wide), a sliding-window layer then a full one,
    soft-capped logits (30, as TRL's tiny Gemma 4), image tokens attending to each other both ways
    (``use_bidirectional_attention="vision"``, driven by ``mm_token_type_ids``), no audio tower."""
    from transformers import Gemma4Config

    ids = tokenizer.convert_tokens_to_ids
    layers = text["num_hidden_layers"]
    text = {**text, "head_dim": 16, "global_head_dim": 16, "sliding_window": 64, "final_logit_softcapping": 30.0,
            "layer_types": ["sliding_attention"] * (layers - 1) + ["full_attention"],
            "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": len(tokenizer),
            "use_bidirectional_attention": "vision"}  # fmt: skip
    # position_embedding_size: 140 patches, the widest side the 70-token budget allows (560 pixels)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, patch_size=4, pooling_kernel_size=2,
                  position_embedding_size=140)  # fmt: skip
    named = {f"{k[:-6]}_token_id": ids(v) for k, v in _GEMMA4_NAMED.items()}  # image_token -> image_token_id, ...
    named["eoa_token_index"] = named.pop("eoa_token_id")
    return Gemma4Config(text_config=text, vision_config=vision, audio_config=None, video_token_id=ids("<|video|>"),
                        tie_word_embeddings=True, **named)  # fmt: skip


def build_tiny_vlm(family: Family, seed: int = 0, hidden_size: int = 64, num_layers: int = 2,
                   dtype: torch.dtype = torch.float32):  # fmt: skip
    """A randomly initialised `<Family>ForConditionalGeneration` matching `build_tiny_processor(family)`; the same
    seed gives the same weights."""
    from transformers import AutoModelForImageTextToText

    tokenizer = build_vlm_tokenizer(family)
    config = _config(family, tokenizer, hidden_size, num_layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config)
    model = model.to(dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def _check_family(family: str) -> None:
    if family not in FAMILIES + MORE_FAMILIES:
        raise ValueError(f"family={family!r} is not a tiny VLM stand-in: use one of {FAMILIES + MORE_FAMILIES}.")
