"""`SFTDataCollator`: tokenised (possibly packed) rows -> a right-padded batch with `labels` (-100 = no loss).

Labels are a row's own `labels` where it has them (pre-tokenized data; taken as is, as TRL 1.16), else the input
ids with -100 on tokens the masks exclude (`completion_mask` when `completion_only_loss`, `assistant_masks` when
`assistant_only_loss`); either way -100 on padding and on the first token of every packed
document after the first: with the causal shift that label would be predicted from the previous document, which
an unpacked row never does. So a packed batch and the same documents unpacked train on exactly the same tokens.

Rows holding several documents (`seq_lengths`, from packing or `padding_free`) get `position_ids` restarting at 0
per document and a 4-D block-diagonal causal `attention_mask`: bool for sdpa, additive float for eager. Under
FlashAttention such batches are flattened into one row (B = 1) with `cu_seq_lens_q/k` for the varlen kernels
and no attention mask.

The batch also carries `token_count` (B,): each row's real, non-padding input tokens, which the trainer pops for
`num_tokens`. Per row, not one scalar, so that accelerate can concatenate and split batches along the batch
dimension (it does for an IterableDataset, whose batches it dispatches from the main process).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from replayrl.data.packing import additive_mask, block_causal_mask, position_ids_from_lengths
from replayrl.data.sft import IGNORE_INDEX, trained_mask

__all__ = ["IGNORE_INDEX", "SFTDataCollator"]


@dataclass
class SFTDataCollator:
    """Collate rows {"input_ids", optional "labels", "completion_mask", "assistant_masks", "seq_lengths"}; a row's
    own `labels` (-100 = no loss) are used as given, the masks otherwise.

    `padding_free=True` flattens the whole batch into one row (B = 1) of documents kept apart as in packing.
    """

    pad_token_id: int
    completion_only_loss: bool = True
    assistant_only_loss: bool = False
    padding_free: bool = False
    attn_implementation: str | None = "sdpa"
    pad_to_multiple_of: int | None = None
    mask_dtype: torch.dtype = torch.float32
    # A prompt-learning adapter (prompt tuning, p-tuning) prepends its soft prompt to each row, which predicts the
    # row's first token: that label is kept (as PEFT's and TRL's). Only for rows of one document (no packing).
    prompt_predicts_first: bool = False

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        rows = [self._row(f) for f in features]
        flash = "flash" in (self.attn_implementation or "")
        if flash and (self.padding_free or any(len(lengths) > 1 for _, _, lengths in rows)):
            return self._varlen_batch(_flatten(rows))
        if self.padding_free:
            rows = [_flatten(rows)]
        return self._batch(rows)

    def _row(self, feature: dict) -> tuple[list[int], list[int], list[int]]:
        """(input_ids, labels, seq_lengths) of one row."""
        ids = list(feature["input_ids"])
        if feature.get("labels") is not None:  # the row's own labels, taken as is (as TRL 1.16)
            labels = list(feature["labels"])
        else:
            if self.assistant_only_loss and "assistant_masks" not in feature:
                raise ValueError("assistant_only_loss=True but a row has no 'assistant_masks' (tokenise it with them).")
            mask = trained_mask(feature, self.completion_only_loss, self.assistant_only_loss)
            labels = [t if m else IGNORE_INDEX for t, m in zip(ids, mask)]
        lengths = list(feature.get("seq_lengths") or [len(ids)])
        start = 0
        for n in lengths:  # a document's first token is never predicted from the one before it
            if start < len(labels) and not (start == 0 and self.prompt_predicts_first):
                labels[start] = IGNORE_INDEX
            start += n
        return ids, labels, lengths

    def _width(self, rows) -> int:
        width = max(len(ids) for ids, _, _ in rows)
        k = self.pad_to_multiple_of
        return -(-width // k) * k if k else width

    def _batch(self, rows: list[tuple[list[int], list[int], list[int]]]) -> dict[str, torch.Tensor]:
        width = self._width(rows)
        batch = {
            "input_ids": torch.tensor([ids + [self.pad_token_id] * (width - len(ids)) for ids, _, _ in rows]),
            "labels": torch.tensor([labels + [IGNORE_INDEX] * (width - len(labels)) for _, labels, _ in rows]),
            "token_count": torch.tensor([len(ids) for ids, _, _ in rows]),
        }
        seq_lengths = [lengths for _, _, lengths in rows]
        if all(len(lengths) == 1 for lengths in seq_lengths):
            batch["attention_mask"] = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _, _ in rows])
            return batch
        batch["position_ids"] = torch.tensor([position_ids_from_lengths(lengths, width) for lengths in seq_lengths])
        batch["token_mask"] = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _, _ in rows])
        mask = block_causal_mask(seq_lengths, width)
        batch["attention_mask"] = additive_mask(mask, self.mask_dtype) if self.attn_implementation == "eager" else mask
        return batch

    def _varlen_batch(self, row: tuple[list[int], list[int], list[int]]) -> dict[str, torch.Tensor]:
        """FlashAttention: one flattened row (B = 1) with the document boundaries as `cu_seq_lens_q/k` for the
        varlen kernels (given here, on the CPU, so the model does not derive them from position_ids in every
        layer) and no attention mask. Padding, if any, is one more sequence at the end, with labels -100."""
        ids, labels, lengths = row
        width = self._width([row])
        pad = width - len(ids)
        if pad:
            lengths = [*lengths, pad]
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        return {
            "input_ids": torch.tensor([ids + [self.pad_token_id] * pad]),
            "labels": torch.tensor([labels + [IGNORE_INDEX] * pad]),
            "position_ids": torch.tensor([position_ids_from_lengths(lengths, width)]),
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": max(lengths),
            "max_length_k": max(lengths),
            "token_count": torch.tensor([len(ids)]),
            "token_mask": torch.tensor([[1] * len(ids) + [0] * pad]),
        }


def _flatten(rows: list[tuple[list[int], list[int], list[int]]]) -> tuple[list[int], list[int], list[int]]:
    """Several (ids, labels, seq_lengths) rows as one row of all their documents."""
    return (
        [t for ids, _, _ in rows for t in ids],
        [t for _, labels, _ in rows for t in labels],
        [n for _, _, lengths in rows for n in lengths],
    )
