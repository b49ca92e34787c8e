"""Prompts: conversational or plain, to text through the chat template, to left-padded token ids."""

from __future__ import annotations

from torch import Tensor


def is_conversational(prompt) -> bool:
    """TRL's test: a prompt given as a list of {"role", "content"} messages."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


def prompts_to_text(tokenizer, prompts: list, chat_template_kwargs: dict | None = None, tools=None) -> list[str]:
    """Plain prompts pass through; conversational prompts go through the chat template, with
    `chat_template_kwargs` (TRL's option, e.g. enable_thinking) and the `tools` the model may call."""
    kwargs = dict(chat_template_kwargs or {})
    if tools:
        kwargs["tools"] = tools
    return [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True, **kwargs)
        if is_conversational(p)
        else p
        for p in prompts
    ]


def tokenize_prompts(tokenizer, texts: list[str], max_prompt_length: int | None) -> tuple[Tensor, Tensor]:
    """Left-padded ids and mask (N, P); long prompts keep their last `max_prompt_length` tokens."""
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    if max_prompt_length is not None and ids.shape[1] > max_prompt_length:
        ids, mask = ids[:, -max_prompt_length:], mask[:, -max_prompt_length:]
    return ids, mask
