"""TRL 1.16's DPO collator (`trl.trainer.dpo_trainer.DataCollatorForPreference`), for code written against it.

replayrl's `DPOTrainer` batches with its own collator; this one gives TRL 1.16's layout for users who call it."""

from __future__ import annotations

import torch
from torch import Tensor

from replayrl.data.preference import pad


class DataCollatorForPreference:
    """Rows with `prompt_ids`, `chosen_ids`, `rejected_ids` (optionally `ref_chosen_logps`, `ref_rejected_logps`)
    -> `input_ids`, `attention_mask`, `completion_mask` (2B, L): every prompt + chosen first, then every prompt +
    rejected, right-padded with `pad_token_id` (the width rounded up to a multiple of `pad_to_multiple_of` when
    given); `completion_mask` marks the chosen / rejected tokens; the reference log-probs as (B,) tensors."""

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None):
        self.pad_token_id, self.pad_to_multiple_of = pad_token_id, pad_to_multiple_of

    def __call__(self, examples: list[dict]) -> dict[str, Tensor]:
        rows, completion = [], []
        for side in ("chosen_ids", "rejected_ids"):
            for e in examples:
                prompt, answer = list(e["prompt_ids"]), list(e[side])
                rows.append(prompt + answer)
                completion.append([0] * len(prompt) + [1] * len(answer))
        multiple = self.pad_to_multiple_of
        batch = {
            "input_ids": pad(rows, self.pad_token_id, multiple=multiple),
            "attention_mask": pad([[1] * len(r) for r in rows], 0, multiple=multiple),
            "completion_mask": pad(completion, 0, multiple=multiple),
        }
        for key in ("ref_chosen_logps", "ref_rejected_logps"):
            if key in examples[0]:
                batch[key] = torch.tensor([float(e[key]) for e in examples])
        return batch


class DataCollatorForVisionPreference:
    """TRL 1.16's vision preference collator (`trl.trainer.dpo_trainer.DataCollatorForVisionPreference`), for code
    written against it: raw conversational rows (`prompt`, `chosen`, `rejected`, an `image`/`images` column) ->
    `input_ids`, `attention_mask`, `completion_mask` (2B, L), every prompt + chosen first, then every prompt +
    rejected, right-padded; the processor's image inputs once per row (each prompt's images twice, as TRL); its
    per-token inputs (`token_type_ids`, `mm_token_type_ids`) at the same (2B, L) shape, 0 on the completions.
    replayrl's `DPOTrainer` batches with its own `VisionDPOCollator`, which this wraps."""

    def __init__(self, processor, max_length: int | None = None, pad_to_multiple_of: int | None = None):
        from replayrl.data.vision import text_tokenizer
        from replayrl.data.vision_collator import VisionDPOCollator

        if pad_to_multiple_of is not None:  # TRL 1.16's refusal
            raise NotImplementedError(
                "Padding to a multiple of a value is not yet implemented for vision-language modeling and "
                "prompt-completion data."
            )
        tokenizer = text_tokenizer(processor)
        image_id = getattr(processor, "image_token_id", None)  # the placeholder the processor expands
        self.inner = VisionDPOCollator(processor, [] if image_id is None else [image_id], max_length=max_length)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def __call__(self, examples: list[dict]) -> dict[str, Tensor]:
        from replayrl.data.vision_collator import vision_model_inputs

        sides = self.inner(examples)
        ids, labels = [], []
        for side in ("chosen", "rejected"):
            mask = sides[f"{side}_attention_mask"].bool()
            ids += [row[m].tolist() for row, m in zip(sides[f"{side}_input_ids"], mask)]
            labels += [row[m].tolist() for row, m in zip(sides[f"{side}_labels"], mask)]
        batch = {
            "input_ids": pad(ids, self.pad_token_id),
            "attention_mask": pad([[1] * len(r) for r in ids], 0),
            "completion_mask": pad([[int(t != self.inner.label_pad_token_id) for t in r] for r in labels], 0),
        }
        batch.update(vision_model_inputs(sides, batch["input_ids"], self.inner.image_token_ids, self.inner.token_keys))
        return batch
