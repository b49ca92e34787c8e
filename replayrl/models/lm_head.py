"""The hidden states in front of the lm_head, so the loss can apply the head chunk by chunk.

A causal LM's forward ends with ``logits = lm_head(hidden)``: with a 152k vocabulary that one matrix product makes
the largest tensor of the step. `forward_to_head` runs the model's own forward (through DDP/PEFT wrappers, so
gradient sync, MoE aux losses and ``logits_to_keep`` work as usual) with a pre-hook on the lm_head that keeps its
input and hands the head zero positions instead; the caller then computes log-probs from ``hidden`` and the head's
weight with `replayrl.algos.logprobs.chunked_token_stats` (a fused linear + log-softmax). Where that is not
known to give the same logits (a family that rescales or soft-caps them, an lm_head that is not a plain
``nn.Linear`` such as a LoRA-wrapped one, parameters sharded by ZeRO-3/FSDP), it falls back to the logits.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor, nn

from replayrl.algos.logprobs import TokenStats, chunked_logit_reduce, chunked_token_stats, log_probs_at, mean_logits
from replayrl.models.attention import base_model

# Families whose logits are exactly ``lm_head(hidden)`` (no scaling, soft-capping or extra terms after it).
FUSED_HEAD_MODEL_TYPES = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "phi3",
        "olmo",
        "olmo2",
        "smollm3",
        "gpt2",
        "gpt_neox",
        "starcoder2",
        "deepseek_v3",
        # vision-language models whose logits are their lm_head's of the language model's last hidden states
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen3_vl",
        "qwen3_5",
        "qwen3_5_moe",
        "llava",
        "llava_next",
        "idefics2",
        "idefics3",
    }
)


class HeadInput(NamedTuple):
    """What the token log-probs are computed from: ``source (B, L, H)`` hidden states with the head's ``weight
    (V, H)`` and ``bias (V,)`` or None, or ``source (B, L, V)`` logits with ``weight = bias = None``."""

    source: Tensor
    weight: Tensor | None = None
    bias: Tensor | None = None
    lead: int = 0  # positions before the first real token's (1: a prompt-learning adapter's last virtual token)

    def token_stats(self, targets: Tensor, **kwargs) -> TokenStats:
        """`chunked_token_stats` of ``targets (B, L)`` (keywords: mask, temperature, with_entropy, ...)."""
        return chunked_token_stats(self.source, targets, weight=self.weight, bias=self.bias, **kwargs)

    def logps_at(self, sources: Tensor, targets: Tensor, rows: Tensor | None = None) -> Tensor:
        """`log_probs_at`: log-probs of ``targets (B, T)`` predicted at ``source[rows[b], sources[b, t]]``."""
        return log_probs_at(self.source, sources, targets, rows, weight=self.weight, bias=self.bias)

    def reduce(self, fn, mask: Tensor | None = None) -> Tensor:
        """`chunked_logit_reduce`: ``fn`` (float32 ``(c, V) -> (c,)``) over each position's logits, no gradient."""
        return chunked_logit_reduce(self.source, fn, weight=self.weight, bias=self.bias, mask=mask)

    def mean_logits(self, mask: Tensor | None = None) -> Tensor:
        """`mean_logits`: each position's mean logit, float32 ``(B, L)``, no gradient."""
        return mean_logits(self.source, weight=self.weight, bias=self.bias, mask=mask)

    def positions(self, index) -> HeadInput:
        """The same head over ``source[:, index]`` (e.g. ``slice(None, -1)``: logits at t predict token t + 1)."""
        return HeadInput(self.source[:, index], self.weight, self.bias)


def fused_head(model) -> nn.Linear | None:
    """The model's lm_head when the fused path gives exactly its logits, else None."""
    base = base_model(model)
    if hasattr(base, "pretrained_model") and hasattr(base, "v_head"):  # value-head wrapper: the LM inside it
        base = base_model(base.pretrained_model)
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in FUSED_HEAD_MODEL_TYPES:
        return None
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if type(head) is not nn.Linear:  # LoRA / modules_to_save wrappers, value heads, ...
        return None
    if any(_is_sharded(p) for p in head.parameters()):
        return None
    return head


def _is_sharded(param: Tensor) -> bool:
    """ZeRO-3 (``ds_id``) and FSDP2 (DTensor) parameters are only whole inside the module's own forward."""
    return hasattr(param, "ds_id") or type(param).__name__ == "DTensor" or type(param.data).__name__ == "DTensor"


def forward_to_head(model, fused: bool = True, keep_prompt_end: bool = False, **inputs) -> tuple[object, HeadInput]:
    """``model(**inputs)`` and the `HeadInput` to compute the token log-probs from.

    With ``fused`` and a `fused_head`, the returned outputs carry empty logits ``(B, 0, V)`` and the head input is
    the hidden states at the positions the logits would have had (``logits_to_keep`` applies); otherwise it is
    ``outputs.logits`` (``outputs[0]`` for a value-head wrapper's tuple). The head input covers the real tokens'
    positions only: the virtual tokens a prompt-learning adapter prepends are dropped (`real_positions`), except,
    with ``keep_prompt_end``, the last one (``lead=1``: it predicts the first real token, as in PEFT's own loss).
    """
    head = fused_head(model) if fused else None
    if head is None:
        outputs = model(**inputs)
        source = outputs[0] if isinstance(outputs, tuple) else outputs.logits
        return outputs, real_positions(HeadInput(source), inputs, keep_prompt_end)
    captured: list[Tensor] = []

    def keep_input(module, args):
        captured.append(args[0])
        return (args[0][..., :0, :],)

    handle = head.register_forward_pre_hook(keep_input)
    try:
        outputs = model(**inputs)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"the lm_head ran {len(captured)} times in one forward; expected once")
    return outputs, real_positions(HeadInput(captured[0], head.weight, head.bias), inputs, keep_prompt_end)


def real_positions(head: HeadInput, inputs: dict, keep_prompt_end: bool = False) -> HeadInput:
    """`head` without the positions a prompt-learning adapter (prompt tuning, p-tuning) prepended to the outputs.

    Those are the positions beyond what the inputs ask for (their length, or an int ``logits_to_keep``), at the
    front; read from the shapes, so an adapter switched off (``disable_adapter()``, a reference pass) adds none.
    ``keep_prompt_end`` keeps the last of them (``lead=1``), which predicts the first real token.
    """
    ids = inputs.get("input_ids", inputs.get("inputs_embeds"))
    if ids is None:
        return head
    length = ids.shape[1]
    keep = inputs.get("logits_to_keep")
    expected = keep if isinstance(keep, int) and 0 < keep <= length else length
    extra = head.source.shape[1] - expected
    if extra <= 0:
        return head
    lead = 1 if keep_prompt_end and expected == length else 0
    return HeadInput(head.source[:, extra - lead :], head.weight, head.bias, lead)
