"""Prompts: conversational or plain, to text through the chat template, to left-padded token ids."""

from __future__ import annotations

from torch import Tensor


def is_conversational(prompt) -> bool:
    """TRL's test: a prompt given as a list of {"role", "content"} messages."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


# Tool arguments the trainer fills in itself (TRL's `_completion_idx`): kept out of the schemas the model is shown.
TRAINER_TOOL_ARGUMENTS = ("_completion_idx",)


def tool_schemas(tools: list) -> list:
    """The chat template's ``tools``: each function's JSON schema (transformers' `get_json_schema`, as
    `apply_chat_template` builds it) without `TRAINER_TOOL_ARGUMENTS`; schemas given as dicts pass through."""
    from transformers.utils import get_json_schema

    out = []
    for tool in tools:
        if isinstance(tool, dict):
            out.append(tool)
            continue
        schema = get_json_schema(tool)
        parameters = schema["function"].get("parameters", {})
        for name in TRAINER_TOOL_ARGUMENTS:
            parameters.get("properties", {}).pop(name, None)
            if name in parameters.get("required", []):
                parameters["required"].remove(name)
        out.append(schema)
    return out


def prompts_to_text(tokenizer, prompts: list, chat_template_kwargs: dict | None = None, tools=None) -> list[str]:
    """Plain prompts pass through; conversational prompts go through the chat template, with
    `chat_template_kwargs` (TRL's option, e.g. enable_thinking) and the `tools` the model may call (`tool_schemas`)."""
    kwargs = dict(chat_template_kwargs or {})
    if tools:
        kwargs["tools"] = tool_schemas(tools)
    return [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True, **kwargs)
        if is_conversational(p)
        else p
        for p in prompts
    ]


def tokenize_prompts(
    tokenizer, texts: list[str], max_prompt_length: int | None, add_special_tokens: bool = False
) -> tuple[Tensor, Tensor]:
    """Left-padded ids and mask (N, P); long prompts keep their last `max_prompt_length` tokens.
    `add_special_tokens`: True for plain-text prompts, which TRL 1.16 (GRPO, RLOO, distillation) tokenizes with the
    tokenizer's special tokens (a Llama-style BOS first; nothing for Qwen); False for chat-template renderings
    (`prompts_to_text`), which carry the template's own (TRL 1.16 tokenizes them in `apply_chat_template`)."""
    enc = tokenizer(
        texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=add_special_tokens
    )
    ids, mask = enc["input_ids"], enc["attention_mask"]
    if max_prompt_length is not None and ids.shape[1] > max_prompt_length:
        ids, mask = ids[:, -max_prompt_length:], mask[:, -max_prompt_length:]
    return ids, mask
