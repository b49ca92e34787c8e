"""SFT batches with images, as TRL 1.16's `DataCollatorForVisionLanguageModeling`: raw rows in, the processor run
at collation time (images cannot be pre-tokenised into the dataset), labels out.

Rows are conversational: a `messages` column (language modeling: every token trained, or with
``assistant_only_loss`` only the assistant turns, as the chat template's ``{% generation %}`` marks say) or
`prompt` + `completion` columns (prompt-completion: with ``completion_only_loss``, only the completion's tokens).
Each row's images (an `image` or `images` column) go first in its first user message (`prepare_multimodal_messages`).
Labels are -100 on padding and on the image placeholder tokens (inputs, not predictions). ``max_length`` cuts rows
from the right; a cut that would leave an image's tokens partly in the row is refused.
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
                 max_length: int | None = None, pad_to_multiple_of: int | None = None,
                 assistant_only_loss: bool = False):  # fmt: skip
        self.processor = processor
        self.assistant_only_loss = assistant_only_loss
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
        if self.assistant_only_loss and prompts is not None:
            raise ValueError(
                "assistant_only_loss=True is only supported for conversational language modeling rows ('messages'); "
                "these rows are prompt-completion: use completion_only_loss instead."
            )
        assistant = None
        if self.assistant_only_loss:
            batch, assistant = self._encode_with_assistant_masks(full, images)
        else:
            batch = self._encode([self.processor.apply_chat_template(m, tokenize=False) for m in full], images)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
        if assistant is not None:
            labels = labels.masked_fill(assistant == 0, IGNORE_INDEX)
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

    def _encode_with_assistant_masks(self, conversations: list, images: list[list]) -> tuple[dict, Tensor]:
        """The batch, rendered and processed by the processor's own `apply_chat_template`, and its assistant masks
        ``(B, L)``: 1 on the tokens inside the template's ``{% generation %}`` marks, found after the processor
        expanded the image placeholders (transformers >= 5.18, as TRL 1.16 requires)."""
        kwargs = dict(padding=True, padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of,
                      add_special_tokens=False)  # fmt: skip
        if any(images):
            kwargs["images"] = images
        out = self.processor.apply_chat_template(
            conversations,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            return_assistant_tokens_mask=True,
            processor_kwargs=kwargs,
        )
        batch = {k: v for k, v in out.items() if isinstance(v, Tensor)}
        return batch, torch.as_tensor(batch.pop("assistant_masks"))

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
