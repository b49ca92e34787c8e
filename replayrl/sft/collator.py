"""TRL 1.16's SFT collator (`trl.trainer.sft_trainer.DataCollatorForLanguageModeling`), for code written against it.

replayrl's `SFTTrainer` batches with its own collator; this one gives TRL 1.16's layout for users who call it."""

from __future__ import annotations

import torch
from torch import Tensor

from replayrl.data.collators import IGNORE_INDEX
from replayrl.data.preference import pad


class DataCollatorForLanguageModeling:
    """Rows with `input_ids` (optionally `labels`, and `seq_lengths` for packed rows) -> a batch.

    Padded (default): `input_ids`, `attention_mask`, `labels` (B, L), right-padded with `pad_token_id` / 0 / -100;
    `labels` default to the input ids; mask columns (`completion_mask`, `assistant_masks`) are not read. With
    `return_position_ids`, also `position_ids` that restart at each packed document (`seq_lengths`).
    Padding-free (`padding_free=True`): the rows concatenated into one (1, sum L) row with `position_ids` and
    `labels` (-100 at each document's first token), no attention mask. `pad_to_multiple_of` rounds the width up.
    """

    def __init__(
        self,
        pad_token_id: int,
        padding_free: bool = False,
        pad_to_multiple_of: int | None = None,
        return_position_ids: bool = False,
    ):
        self.pad_token_id, self.padding_free = pad_token_id, padding_free
        self.pad_to_multiple_of, self.return_position_ids = pad_to_multiple_of, return_position_ids

    @staticmethod
    def get_position_ids_from_packed_seq_lengths(batch_seq_lengths: list[list[int]]) -> list[Tensor]:
        """Per example, the positions of its packed documents: [[3, 2]] -> [tensor([0, 1, 2, 0, 1])]."""
        return [torch.cat([torch.arange(n) for n in lengths]) for lengths in batch_seq_lengths]

    def _positions(self, examples: list[dict]) -> list[list[int]]:
        lengths = [e.get("seq_lengths") or [len(e["input_ids"])] for e in examples]
        return [p.tolist() for p in self.get_position_ids_from_packed_seq_lengths(lengths)]

    def __call__(self, examples: list[dict]) -> dict[str, Tensor]:
        ids = [list(e["input_ids"]) for e in examples]
        labels = [list(e["labels"]) if e.get("labels") is not None else list(i) for e, i in zip(examples, ids)]
        multiple = self.pad_to_multiple_of
        if self.padding_free:
            positions = [p for row in self._positions(examples) for p in row]
            flat = [token for row in labels for token in row]
            flat = [IGNORE_INDEX if pos == 0 else token for token, pos in zip(flat, positions)]
            return {
                "input_ids": pad([[t for row in ids for t in row]], self.pad_token_id, multiple=multiple),
                "position_ids": pad([positions], 0, multiple=multiple),
                "labels": pad([flat], IGNORE_INDEX, multiple=multiple),
            }
        batch = {
            "input_ids": pad(ids, self.pad_token_id, multiple=multiple),
            "attention_mask": pad([[1] * len(i) for i in ids], 0, multiple=multiple),
        }
        if self.return_position_ids:
            batch["position_ids"] = pad(self._positions(examples), 0, multiple=multiple)
        batch["labels"] = pad(labels, IGNORE_INDEX, multiple=multiple)
        return batch
