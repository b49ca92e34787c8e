"""The vision-language side of the scale benchmark (`vlm_scale.py`, `scale_worker.py --trainer grpo_vlm*`): a
Qwen2.5-VL-shaped model, its processor and image data, and a probe of the vision tower's saved activations.

Imports only the standard library at module level: `scale_worker.py` imports it inside the TRL virtualenv too, where
replayrl is not installed (`make_assets` runs in the driver, with replayrl).
"""

from __future__ import annotations

from pathlib import Path

VOCAB = 151_936
# Qwen2.5-VL-3B-Instruct's vision tower (config.json's vision_config) with fewer blocks: the last block of each run
# of window-attention blocks attends fully (the published model: blocks 7, 15, 23, 31 of 32).
VISION = dict(hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14, spatial_merge_size=2,
              temporal_patch_size=2, window_size=112, in_channels=3, hidden_act="silu")  # fmt: skip
SHAPES = {
    "cpu": dict(hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=1024, vision_depth=2),
    "gpu": dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864, vision_depth=8),
}
PROMPT = "What colour is the shape? Answer R, G or B."


def make_assets(work: Path, shape: dict, image_size: int = 448, rows: int = 64) -> tuple[Path, Path]:
    """The model (bf16, seeded random weights) and its tokenizer saved in `work/vlm-model`; `rows` conversational
    prompts, each with its own `image_size` square noise image, saved as a `datasets` dataset in `work/vlm-data`."""
    import numpy as np
    import torch
    from datasets import Dataset
    from PIL import Image
    from transformers import AutoModelForImageTextToText, Qwen2_5_VLConfig

    from replayrl.models.tiny_vlm import build_vlm_tokenizer

    tok = build_vlm_tokenizer("qwen2_5_vl")
    ids = tok.convert_tokens_to_ids
    hidden, heads = shape["hidden_size"], shape["num_heads"]
    half = hidden // heads // 2  # mrope sections over half the head dim, in Qwen2.5-VL's 16:24:24 proportions
    text = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=shape["intermediate_size"],
                num_hidden_layers=shape["num_layers"], num_attention_heads=heads,
                num_key_value_heads=shape["num_kv_heads"], max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                 "mrope_section": [half // 4, 3 * half // 8, 3 * half // 8]},
                pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id,
                eos_token_id=tok.eos_token_id)  # fmt: skip
    depth = shape["vision_depth"]
    full = list(range(depth))[7::8] or [depth - 1]
    vision = dict(VISION, depth=depth, out_hidden_size=hidden, fullatt_block_indexes=full)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                              video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                              vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config).to(torch.bfloat16)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model_dir = work / "vlm-model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8)) for _ in range(rows)]
    prompts = [[{"role": "user", "content": PROMPT}] for _ in range(rows)]
    data_dir = work / "vlm-data"
    Dataset.from_dict({"prompt": prompts, "image": images}).save_to_disk(str(data_dir))
    return model_dir, data_dir


def load_processor(model_dir: str):
    """Qwen2.5-VL's processor with the published image-processor settings (transformers' defaults: patch 14, merge
    2, 3,136 to 12,845,056 pixels), the saved tokenizer and its chat template, without the video processor (it needs
    torchvision, which has no CPU build for torch 2.13; `replayrl.models.processors.without_video` does the same)."""
    from transformers import AutoTokenizer, Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil

    class ImageOnly(Qwen2_5_VLProcessor):
        video_processor = None

        @classmethod
        def get_attributes(cls):
            return [name for name in super().get_attributes() if name != "video_processor"]

    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    return ImageOnly(image_processor=Qwen2VLImageProcessorPil(), tokenizer=tok, chat_template=tok.chat_template)


class VisionActivations:
    """The bytes the vision tower's forward passes save for backward (autograd's saved tensors, each storage once,
    weights not counted), recorded per forward pass run with gradients; forward passes without gradients (generation,
    old-policy log-probs) save nothing and are skipped."""

    def __init__(self, model):
        import torch

        self.tower = next(m for name, m in model.named_modules() if name.endswith("visual"))
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.passes: list[dict] = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.tower.register_forward_pre_hook(self._enter)
        self.tower.register_forward_hook(self._exit)

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.weights:
            self._seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    def _enter(self, module, args):
        import torch

        self._active = torch.is_grad_enabled()
        if self._active:
            self._seen: dict[int, int] = {}
            self._hooks.__enter__()

    def _exit(self, module, args, output):
        if self._active:
            self._hooks.__exit__(None, None, None)
            patches = int(args[0].shape[0]) if args else 0
            self.passes.append({"patches": patches, "saved_mib": sum(self._seen.values()) / 2**20})


def tower_saved_mib(depths=(1, 2, 4), image_size: int = 448) -> dict[int, float]:
    """The vision tower alone (`VISION`, bf16, random weights) at each depth: MiB its forward pass with gradients
    saves for backward on one `image_size` square image. The difference between depths is the per-block cost, the
    rest the patch embedding and the merger; a deeper tower extrapolates linearly (`VisionActivations` is the probe)."""
    import torch
    from PIL import Image
    from transformers import Qwen2_5_VLConfig, Qwen2VLImageProcessorPil
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    enc = Qwen2VLImageProcessorPil()(
        images=[Image.new("RGB", (image_size, image_size), (200, 10, 10))], return_tensors="pt"
    )
    saved = {}
    for depth in depths:
        vision = dict(VISION, depth=depth, out_hidden_size=256, fullatt_block_indexes=[depth - 1])
        torch.manual_seed(0)
        holder = torch.nn.Module()
        holder.visual = Qwen2_5_VisionTransformerPretrainedModel._from_config(
            Qwen2_5_VLConfig(vision_config=vision).vision_config
        ).to(torch.bfloat16)
        probe = VisionActivations(holder)
        holder.visual(enc["pixel_values"].to(torch.bfloat16), grid_thw=enc["image_grid_thw"])
        saved[depth] = probe.passes[0]["saved_mib"]
    return saved
