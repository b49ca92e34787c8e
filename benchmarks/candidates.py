"""Prototypes of proposed replayrl speed-ups, applied by monkeypatching so that they can be A/B-timed end to end
(`grpo_worker.py --candidate NAME`) without editing replayrl/. Not used by any default benchmark run.

- `shared_logsoftmax` (replaces `replayrl.algos.token_logps_and_entropy`): one `log_softmax` per row gives both
  the token log-probs and, under `no_grad`, the entropy; the division by the temperature is skipped at 1.0.
  Today the loss pass runs a per-row logsumexp for the log-probs and a second chunked log_softmax for the
  entropy on logits that require grad, so autograd saves ~4x the logits for a metric.
- `lean_generate` (replaces `replayrl.grpo.trainer.generate_completions`): a minimal KV-cache sampling loop that drops
  rows from the batch (and the cache) once they have produced EOS, instead of `model.generate`, which computes
  finished rows until the longest one ends. Supports temperature sampling without top-k/top-p/min-p/penalties.
"""

from __future__ import annotations

CANDIDATES = ("shared_logsoftmax", "lean_generate")


def token_logps_and_entropy(logits, index, temperature: float, with_entropy: bool):
    """Drop-in for `replayrl.algos.token_logps_and_entropy`. logits: (B, T, V), index: (B, T) -> ((B, T), (B, T))."""
    import torch
    import torch.nn.functional as F

    if temperature != 1.0:
        logits = logits / temperature
    logps, entropy = [], []
    for row_logits, row_index in zip(logits, index):  # per row: bounds the (T, V) temporaries
        row_logps = F.log_softmax(row_logits.float(), dim=-1)
        logps.append(row_logps.gather(-1, row_index.unsqueeze(-1)).squeeze(-1))
        if with_entropy:
            with torch.no_grad():  # a logged metric: no graph, nothing saved for backward
                detached = row_logps.detach()
                entropy.append(-torch.where(detached > -torch.inf, detached.exp() * detached, 0).sum(-1))
    return torch.stack(logps), torch.stack(entropy) if with_entropy else None


def lean_generate_completions(model, prompt_ids, prompt_mask, generation_config):
    """Drop-in for `replayrl.generation.hf.generate_completions` (same outputs), plain temperature sampling only."""
    import torch
    from transformers import DynamicCache

    from replayrl.generation.hf import completion_mask_from_eos

    gc = generation_config
    if (gc.top_k or 0) > 0 or (gc.top_p or 1.0) < 1.0 or gc.min_p or (gc.repetition_penalty or 1.0) != 1.0:
        raise ValueError("lean_generate prototype: temperature sampling only (top_k=0, top_p=1, no min_p/penalty)")
    eos = torch.as_tensor(gc.eos_token_id).reshape(-1)
    n, width = prompt_ids.shape[0], gc.max_new_tokens
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            attn, pos = prompt_mask.clone(), (prompt_mask.cumsum(-1) - 1).clamp(min=0)
            cache = DynamicCache(config=model.config)
            out = model(
                input_ids=prompt_ids, attention_mask=attn, position_ids=pos, past_key_values=cache, logits_to_keep=1
            )
            pos = pos[:, -1:] + 1
            result = torch.full((n, width), gc.pad_token_id, dtype=torch.long)
            alive, used = torch.arange(n), width
            for t in range(width):
                probs = (out.logits[:, -1].float() / gc.temperature).softmax(-1)
                token = torch.multinomial(probs, 1)
                result[alive, t] = token[:, 0]
                finished = torch.isin(token[:, 0], eos)
                if t == width - 1 or bool(finished.all()):
                    used = t + 1  # like generate: as wide as the longest completion
                    break
                if bool(finished.any()):
                    keep = (~finished).nonzero()[:, 0]
                    alive, token, attn, pos = alive[keep], token[keep], attn[keep], pos[keep]
                    cache.batch_select_indices(keep)
                attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], 1)
                out = model(input_ids=token, attention_mask=attn, position_ids=pos, past_key_values=cache)
                pos = pos + 1
    finally:
        model.train(was_training)
    result = result[:, :used]
    mask, truncated = completion_mask_from_eos(result, gc.eos_token_id)
    return result.masked_fill(mask == 0, gc.pad_token_id), mask, truncated


def apply(names: list[str]) -> None:
    """Patch the named candidates into replayrl (call before building the trainer)."""
    import replayrl.algos
    import replayrl.grpo.trainer

    for name in names:
        if name == "shared_logsoftmax":
            replayrl.algos.token_logps_and_entropy = token_logps_and_entropy
        elif name == "lean_generate":
            replayrl.grpo.trainer.generate_completions = lean_generate_completions
        else:
            raise ValueError(f"unknown candidate {name!r}; expected one of {CANDIDATES}")
