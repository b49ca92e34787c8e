"""SFT batches with images, as TRL 1.16's `DataCollatorForVisionLanguageModeling`: raw rows in, the processor run
at collation time (images cannot be pre-tokenised into the dataset), labels out.

Rows are conversational: a `messages` column (language modeling: every token trained) or `prompt` + `completion`
columns (prompt-completion: with ``completion_only_loss``, only the completion's tokens). Each row's images (an
`image` or `images` column) go first in its first user message (`prepare_multimodal_messages`). Labels are -100 on
padding and on the image placeholder tokens (inputs, not predictions). ``max_length`` cuts rows from the right;
a cut that would leave an image's tokens partly in the row is refused.
"""

from __future__ import annotations

import torch
from torch import Tensor

from replayrl.data.collators import IGNORE_INDEX
from replayrl.data.vision import TOKEN_KEYS, prepare_multimodal_messages, row_images, text_tokenizer


class VisionSFTCollator:
    """Raw rows -> ``input_ids``, ``attention_mask``, ``labels`` (B, L), right-padded, plus the processor's image
    inputs (``pixel_values``, ``image_grid_thw``, ...)."""

    def __init__(self, processor, image_token_ids: list[int], completion_only_loss: bool = True,
                 max_length: int | None = None, pad_to_multiple_of: int | None = None):  # fmt: skip
        self.processor = processor
        self.image_token_ids = torch.tensor(image_token_ids, dtype=torch.long)
        self.completion_only_loss = completion_only_loss
        self.max_length = max_length
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, rows: list[dict]) -> dict[str, Tensor]:
        images = [row_images(r) or [] for r in rows]
        if "messages" in rows[0]:
            full = [prepare_multimodal_messages(r["messages"], len(i)) for r, i in zip(rows, images)]
            prompts = None
        else:
            prompts = [prepare_multimodal_messages(r["prompt"], len(i)) for r, i in zip(rows, images)]
            full = [p + list(r["completion"]) for p, r in zip(prompts, rows)]
        texts = [self.processor.apply_chat_template(m, tokenize=False) for m in full]
        batch = self._encode(texts, images)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
        labels = labels.masked_fill(torch.isin(labels, self.image_token_ids), IGNORE_INDEX)
        if prompts is not None and self.completion_only_loss:
            texts = [self.processor.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
            lengths = self._encode(texts, images)["attention_mask"].sum(1)
            positions = torch.arange(labels.shape[1]).expand_as(labels)
            labels = labels.masked_fill(positions < lengths[:, None], IGNORE_INDEX)
        batch["labels"] = labels
        return self._truncate(batch)

    def _encode(self, texts: list[str], images: list[list]) -> dict[str, Tensor]:
        kwargs = {"images": images} if any(images) else {}
        padding = dict(padding=True, padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of)
        enc = self.processor(text=texts, return_tensors="pt", add_special_tokens=False, **padding, **kwargs)
        return {k: v for k, v in enc.items() if isinstance(v, Tensor)}

    def _truncate(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        width = batch["input_ids"].shape[1]
        if self.max_length is None or width <= self.max_length:
            return batch
        cut = self.max_length
        is_image = torch.isin(batch["input_ids"], self.image_token_ids)
        if is_image[:, cut:].any():
            raise ValueError(
                f"max_length={self.max_length} would cut a row's image tokens (its image inputs would no longer match "
                "its tokens). Raise max_length (or set it to None), or use smaller images."
            )
        return {k: (v[:, :cut] if v.dim() == 2 and v.shape[1] == width and k in _TOKEN_WISE else v)
                for k, v in batch.items()}  # fmt: skip


_TOKEN_WISE = frozenset({"input_ids", "attention_mask", "labels", "token_type_ids", "mm_token_type_ids"})


def vision_sft_tokenizer(processing_class):
    """The tokenizer a processor carries (padding set up as SFT needs it)."""
    tokenizer = text_tokenizer(processing_class)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


class VisionDPOCollator:
    """Raw preference rows with images (conversational `prompt`, `chosen`, `rejected`; an `image`/`images` column)
    -> the per-side DPO batch (`chosen_input_ids`, `chosen_attention_mask`, `chosen_labels`, the same for
    `rejected_*`: prompt + completion, right-padded, labels `label_pad_token_id` on the prompt and padding) plus the
    processor's image inputs of the B prompts under ``vision_<key>`` (`vision_model_inputs` lays them out for the
    2B chosen + rejected rows). ``ref_chosen_logps`` / ``ref_rejected_logps`` pass through when present."""

    def __init__(self, processor, image_token_ids: list[int], label_pad_token_id: int = IGNORE_INDEX,
                 max_length: int | None = None):  # fmt: skip
        self.sft = VisionSFTCollator(processor, image_token_ids, completion_only_loss=True, max_length=max_length)
        self.label_pad_token_id = label_pad_token_id
        self.pad_token_id = text_tokenizer(processor).pad_token_id
        self.image_token_ids = list(image_token_ids)
        self.token_keys: set[str] = set()  # the per-token inputs the processor returns (rebuilt per forward)

    def __call__(self, rows: list[dict]) -> dict[str, Tensor]:
        batch: dict[str, Tensor] = {}
        for side in ("chosen", "rejected"):
            sides = [{**r, "completion": r[side]} for r in rows]
            out = self.sft([{k: v for k, v in r.items() if k not in ("chosen", "rejected")} for r in sides])
            batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"] = (
                out.pop("input_ids"),
                out.pop("attention_mask"),
            )
            labels = out.pop("labels")
            # image placeholders are prompt tokens (labelled already); padding and prompt: the DPO label pad
            batch[f"{side}_labels"] = labels.masked_fill(labels == IGNORE_INDEX, self.label_pad_token_id)
            self.token_keys |= {k for k in out if k in TOKEN_KEYS}
            if side == "chosen":
                batch.update({f"vision_{k}": v for k, v in out.items() if k not in TOKEN_KEYS})
        for key in ("ref_chosen_logps", "ref_rejected_logps"):
            if key in rows[0]:
                batch[key] = torch.tensor([float(r[key]) for r in rows], dtype=torch.float32)
        return batch


def vision_model_inputs(batch: dict[str, Tensor], ids: Tensor, image_token_ids: list[int], token_keys) -> dict:
    """The model's image inputs for the 2B rows ``ids`` (every chosen row, then every rejected one) of a batch from
    `VisionDPOCollator`: the B prompts' per-image tensors twice, and the per-token keys the model takes (``token_keys``,
    e.g. ``token_type_ids``) rebuilt as 1 on the image placeholders (what the processors return for images)."""
    out = {k[len("vision_") :]: torch.cat([v, v]) for k, v in batch.items() if k.startswith("vision_")}
    if not out:
        return out
    is_image = torch.isin(ids, torch.tensor(image_token_ids, device=ids.device)).long()
    return {**out, **{key: is_image for key in token_keys}}
