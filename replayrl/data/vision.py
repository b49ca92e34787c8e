"""Images in prompts, as TRL 1.16 takes them: an ``image`` or ``images`` column (PIL images, paths, bytes, or the
``{"bytes", "path"}`` dicts of an undecoded `datasets.Image` column), conversational prompts that get one
``{"type": "image"}`` part per image (TRL's `prepare_multimodal_messages`), and a processor that turns text + images
into token ids and the model's extra inputs (``pixel_values``, ``image_grid_thw``, ``token_type_ids``, ...).

`VisionInputs` carries those extra inputs for a batch of rows *once per prompt*: the G completions of a group share
one stored copy of their prompt's pixels, and a row only names the prompt it belongs to. The model's batched
keyword arguments are assembled from it for each forward pass (`model_kwargs`).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

IMAGE_COLUMNS = ("image", "images")
# Per-token inputs (one value per prompt token, 0 on text): stored over the prompt's real tokens, rebuilt at the
# batch's widths, 0 on padding and on the completion (TRL appends zeros for the completion too).
TOKEN_KEYS = frozenset({"token_type_ids", "mm_token_type_ids"})
_TEXT_KEYS = frozenset({"input_ids", "attention_mask"})


def has_images(dataset) -> bool:
    """Whether a dataset (or its first row) has an image column."""
    names = getattr(dataset, "column_names", None) or []
    return any(c in names for c in IMAGE_COLUMNS)


def any_images(train_dataset, eval_dataset=None) -> bool:
    """Whether the train dataset or any eval dataset (one, or a dict of them) has an image column."""
    evals = list(eval_dataset.values()) if isinstance(eval_dataset, dict) else [eval_dataset]
    return any(d is not None and has_images(d) for d in [train_dataset, *evals])


def load_image(image):
    """A PIL RGB image from a PIL image, a path, bytes, or a ``{"bytes", "path"}`` dict."""
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError("images need pillow: `pip install replayrl[vlm]`.") from err

    if isinstance(image, dict):
        image = image.get("bytes") or image.get("path")
    if isinstance(image, (bytes, bytearray)):
        image = Image.open(io.BytesIO(image))
    elif isinstance(image, (str, Path)):
        image = Image.open(image)
    if not isinstance(image, Image.Image):
        raise ValueError(
            f"an image must be a PIL image, a path, bytes or a {{'bytes', 'path'}} dict (got {type(image).__name__})."
        )
    return image.convert("RGB")


def row_images(example: dict) -> list | None:
    """The images of one dataset row: its ``image`` (one) or ``images`` (a list) column; None when it has none."""
    if example.get("images") is not None:
        images = list(example["images"])
    elif example.get("image") is not None:
        images = [example["image"]]
    else:
        return None
    return [load_image(i) for i in images] or None


def prepare_multimodal_messages(prompt, num_images: int) -> list[dict]:
    """TRL's `prepare_multimodal_messages`: string contents become ``[{"type": "text", "text": ...}]`` and, unless
    the prompt already has image parts, ``num_images`` ``{"type": "image"}`` parts go first in the first user
    message. A plain-text prompt cannot say where its images go: refused."""
    if not (isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)):
        raise ValueError(
            "rows with an 'image'/'images' column need conversational prompts ([{'role': 'user', 'content': ...}]), "
            f"whose images the processor's chat template places (got {type(prompt).__name__} {str(prompt)[:60]!r})."
        )
    messages = []
    for message in prompt:
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        messages.append({**message, "content": list(content)})
    if any(part.get("type") == "image" for m in messages for part in m["content"]):
        return messages
    first_user = next((m for m in messages if m["role"] == "user"), messages[0])
    first_user["content"] = [{"type": "image"} for _ in range(num_images)] + first_user["content"]
    return messages


def image_token_ids(config) -> list[int]:
    """The placeholder token ids a VLM's config names (image, video, audio, Gemma 3's soft image token), which the model
    replaces by image features: a completion must never contain one (its forward would find more placeholders
    than features), so generation suppresses them."""
    names = ("image_token_id", "video_token_id", "image_token_index", "video_token_index", "audio_token_id")
    ids = {getattr(config, n, None) for n in names}
    return sorted(i for i in ids if isinstance(i, int) and i >= 0)


def text_tokenizer(processing_class):
    """The tokenizer of a processor (or the tokenizer itself)."""
    return getattr(processing_class, "tokenizer", processing_class)


def text_processing_class(processing_class):
    """What text-only rows are tokenised with: a processor's tokenizer (called on text alone, a processor would take
    the text for images), carrying the processor's chat template when it has none; a tokenizer as it is."""
    if not is_processor(processing_class):
        return processing_class
    tokenizer = processing_class.tokenizer
    if not getattr(tokenizer, "chat_template", None) and getattr(processing_class, "chat_template", None):
        tokenizer.chat_template = processing_class.chat_template
    return tokenizer


def is_processor(processing_class) -> bool:
    return hasattr(processing_class, "image_processor")


@dataclass
class VisionInputs:
    """The vision inputs of N rows. ``items[k]``: one prompt's inputs, per-image tensors with images (or patches)
    on dim 0 (``pixel_values``, ``image_grid_thw``, ``image_sizes``, ...) and per-token tensors ``(L_k,)`` over the
    prompt's real tokens (`TOKEN_KEYS`); ``row_item: (N,)`` long, the item of each row. Rows that share a prompt
    share its tensors: nothing is copied per completion."""

    items: list[dict[str, Tensor]]
    row_item: Tensor

    def __getitem__(self, index) -> VisionInputs:
        """The rows selected by a slice or an index tensor; only the items they use are kept."""
        rows = self.row_item[index]
        used = sorted(set(rows.tolist()))
        remap = {old: new for new, old in enumerate(used)}
        new_rows = torch.tensor([remap[r] for r in rows.tolist()], dtype=torch.long)
        return VisionInputs([self.items[k] for k in used], new_rows)

    def to(self, device) -> VisionInputs:
        return VisionInputs([{k: v.to(device) for k, v in item.items()} for item in self.items], self.row_item)

    def clone(self) -> VisionInputs:
        return VisionInputs([{k: v.clone() for k, v in item.items()} for item in self.items], self.row_item.clone())

    @property
    def num_rows(self) -> int:
        return len(self.row_item)

    def nbytes(self) -> int:
        """Bytes held by the stored tensors (once per prompt)."""
        return sum(v.numel() * v.element_size() for item in self.items for v in item.values())

    @classmethod
    def concat(cls, parts: list[VisionInputs]) -> VisionInputs:
        items, rows, offset = [], [], 0
        for part in parts:
            items.extend(part.items)
            rows.append(part.row_item + offset)
            offset += len(part.items)
        return cls(items, torch.cat(rows))

    def model_kwargs(self, prompt_mask: Tensor, completion_width: int = 0) -> dict[str, Tensor]:
        """The batched extra inputs of the model for rows whose prompts are ``prompt_mask (N, P)`` (left-padded),
        followed by ``completion_width`` completion positions: per-image tensors concatenated in row order,
        per-token tensors laid out as ``(N, P + completion_width)``."""
        rows = [self.items[k] for k in self.row_item.tolist()]
        out: dict[str, Tensor] = {}
        keys = dict.fromkeys(key for row in rows for key in row)  # rows without images (text among them) lack some
        for key in keys:
            if key in TOKEN_KEYS:
                out[key] = _token_field([r.get(key) for r in rows], prompt_mask, completion_width)
            else:
                out[key] = torch.cat([r[key] for r in rows if key in r])
        return out

    def state_dict(self) -> dict:
        return {"items": self.items, "row_item": self.row_item}

    @classmethod
    def from_state_dict(cls, state: dict) -> VisionInputs:
        return cls(list(state["items"]), state["row_item"])


def _token_field(values: list[Tensor | None], prompt_mask: Tensor, completion_width: int) -> Tensor:
    n, width = prompt_mask.shape
    dtype = next(v for v in values if v is not None).dtype
    out = torch.zeros((n, width + completion_width), dtype=dtype, device=prompt_mask.device)
    for i, value in enumerate(values):
        if value is not None:  # None: a row the processor gave no such field (0 everywhere)
            real = prompt_mask[i].bool().nonzero().squeeze(1)
            out[i, real] = value.to(out.device)
    return out


def encode_prompts(processor, texts: list[str], images: list[list], group_size: int, max_prompt_length: int | None):
    """Tokenize ``texts`` (N rows, consecutive runs of ``group_size`` rows share a prompt and its ``images``: one
    list per group) with the processor, once per group. Returns left-padded ``prompt_ids, prompt_mask (N, P)``
    and the `VisionInputs` (one item per group). A prompt longer than ``max_prompt_length`` is refused: cutting it
    would cut image tokens, or leave image tokens whose pixels the model no longer matches."""
    tokenizer = text_tokenizer(processor)
    ids_list, items = [], []
    for g in range(len(texts) // group_size):
        group_images = {"images": images[g]} if images[g] else {}  # none: a text-only row among image rows
        enc = processor(text=[texts[g * group_size]], return_tensors="pt", add_special_tokens=False, **group_images)
        ids = enc["input_ids"][0]
        if max_prompt_length is not None and len(ids) > max_prompt_length:
            raise ValueError(
                f"a prompt with images is {len(ids)} tokens long, over max_prompt_length={max_prompt_length}; "
                "truncating it would cut its image tokens. Set max_prompt_length=None or larger, or use fewer or "
                "smaller images."
            )
        ids_list.append(ids)
        item = {k: v for k, v in enc.items() if k not in _TEXT_KEYS and isinstance(v, Tensor)}
        items.append({k: (v[0] if k in TOKEN_KEYS else v) for k, v in item.items()})
    width = max(len(i) for i in ids_list)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompt_ids = torch.full((len(texts), width), pad, dtype=torch.long)
    prompt_mask = torch.zeros((len(texts), width), dtype=torch.long)
    for row in range(len(texts)):
        ids = ids_list[row // group_size]
        prompt_ids[row, width - len(ids) :], prompt_mask[row, width - len(ids) :] = ids, 1
    row_item = torch.arange(len(texts)) // group_size
    return prompt_ids, prompt_mask, VisionInputs(items, row_item)
