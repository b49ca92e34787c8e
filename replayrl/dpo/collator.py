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
