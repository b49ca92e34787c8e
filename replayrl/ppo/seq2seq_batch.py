"""Encoder-decoder PPO batches (`AutoModelForSeq2SeqLMWithValueHead`, TRL v0.7.1's `is_encoder_decoder` path).

The query goes to the encoder, right-padded (``input_ids, attention_mask: (B, Q)``); the response is the decoder's
input, right-padded (``decoder_input_ids, decoder_attention_mask: (B, D)``), beginning with the model's decoder
start token (what ``generate`` returns; prepended when a response does not begin with it). Response token
``decoder_input_ids[:, t + 1]`` is predicted, and valued, at decoder position t, so every per-token tensor is
``(B, D - 1)``: the same layout as the decoder-only batch, whose columns are response tokens too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from replayrl.models.lm_head import HeadInput


@dataclass
class Seq2SeqPPOBatch:
    """Encoder inputs ``(B, Q)``, decoder inputs ``(B, D)`` and ``response_mask: (B, D - 1)`` (the decoder's
    padding and the user's ``response_masks`` combined)."""

    input_ids: Tensor
    attention_mask: Tensor
    decoder_input_ids: Tensor
    decoder_attention_mask: Tensor
    response_mask: Tensor

    def select(self, rows: Tensor) -> Seq2SeqPPOBatch:
        """The rows ``rows``, with trailing columns that are padding in all of them dropped (same results)."""
        enc, dec = self.attention_mask[rows], self.decoder_attention_mask[rows]
        q_width, d_width = int(enc.sum(1).max()), int(dec.sum(1).max())
        return Seq2SeqPPOBatch(
            input_ids=self.input_ids[rows, :q_width],
            attention_mask=enc[:, :q_width],
            decoder_input_ids=self.decoder_input_ids[rows, :d_width],
            decoder_attention_mask=dec[:, :d_width],
            response_mask=self.response_mask[rows, : d_width - 1],
        )


def pad_right(sequences: list[Tensor], pad_token_id: int) -> tuple[Tensor, Tensor]:
    """``(ids, attention_mask)``, both ``(B, max_len)``, the sequences right-padded."""
    width = max(len(s) for s in sequences)
    ids = torch.stack([F.pad(s, (0, width - len(s)), value=pad_token_id) for s in sequences]).long()
    mask = torch.stack([F.pad(torch.ones_like(s), (0, width - len(s))) for s in sequences]).long()
    return ids, mask


def build_seq2seq_batch(
    queries: list[Tensor],
    responses: list[Tensor],
    pad_token_id: int,
    decoder_start_token_id: int,
    response_masks: list[Tensor] | None = None,
) -> Seq2SeqPPOBatch:
    """``queries[i]: (Lq_i,)`` encoder ids; ``responses[i]: (Lr_i,)`` decoder ids (decoder start first, or it is
    prepended); ``response_masks[i]: (Lr_i,)`` 0/1 over ``responses[i]``."""
    decoder_inputs, trained = [], []
    for i, response in enumerate(responses):
        mask = torch.ones(len(response)) if response_masks is None else response_masks[i].float().cpu()
        if int(response[0]) == decoder_start_token_id:
            response, mask = response, mask[1:]  # the start token itself is not trained
        else:
            response = torch.cat([response.new_tensor([decoder_start_token_id]), response])
        if len(response) < 2:
            raise ValueError(
                f"responses[{i}] holds only the decoder start token ({decoder_start_token_id}): an encoder-decoder "
                "response needs at least one token after it to train on."
            )
        decoder_inputs.append(response)
        trained.append(mask)
    input_ids, attention_mask = pad_right([q.cpu() for q in queries], pad_token_id)
    decoder_input_ids, decoder_attention_mask = pad_right([r.cpu() for r in decoder_inputs], pad_token_id)
    width = decoder_input_ids.shape[1] - 1
    response_mask = torch.stack([F.pad(m, (0, width - len(m))) for m in trained])
    return Seq2SeqPPOBatch(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, response_mask)


def seq2seq_forward(model, batch: Seq2SeqPPOBatch, temperature: float, full_logprobs: bool, entropy: bool, keep_logits):
    """`replayrl.ppo.batch.forward` for an encoder-decoder value-head model: per-response-token log-probs and
    values ``(B, D - 1)`` (the decoder's own logits: encoder-decoder heads are not fused, `models.lm_head`)."""
    from replayrl.ppo.batch import ForwardOutput

    logits, _, values = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        decoder_input_ids=batch.decoder_input_ids,
        decoder_attention_mask=batch.decoder_attention_mask,
    )[:3]
    logits = logits[:, :-1].float() / temperature
    targets = batch.decoder_input_ids[:, 1:]
    stats = HeadInput(logits).token_stats(targets, with_entropy=entropy)
    result = ForwardOutput(stats.logps, values[:, :-1], entropy=stats.entropy)
    result.full_logprobs = F.log_softmax(logits, dim=-1) if full_logprobs else None
    result.logits = logits if keep_logits else None  # TRL v0.7.1's `loss` hook: a stat (entropy) only
    return result
