"""Built-in offline tool-calling task: a tiny model learns, by GRPO, to call a calculator tool.

Task: two-number addition "23+58" asked in a chat; the policy may answer directly or call the `add` tool
(``<tool_call>{"name": "add", "arguments": {"a": 23, "b": 58}}</tool_call>``), read the tool's result and answer
with it. Reward (`final_answer_reward`): 1.0 when the last assistant message is exactly the sum, else 0.0.

Policy: the tiny Qwen2 of `replayrl.models.tiny`, given a short supervised warm-up on a noisy teacher that answers
directly with a wrong guess half of the time, and otherwise calls the tool, with the right arguments only half of
those times (an off-by-one argument else), always copying the tool's result into its answer. Only the reward
says which behaviour is right: GRPO raises the rate of correct tool calls, so the reward rises from ~0.2-0.4.
"""

from __future__ import annotations

import json
import random

import torch
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from replayrl.models.tiny import build_tiny_model, build_tokenizer

TOOL_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' and m.get('tool_calls') %}<|im_start|>assistant\n{{ m['content'] }}"
    "{% for c in m['tool_calls'] %}<tool_call>{{ c['function'] | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}<|im_start|>tool\n{{ m['content'] }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MODEL_KWARGS = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}
LOW, HIGH = 10, 49  # operand range
# 400 steps left the imitation seed-dependent: model seeds 1 and 2 started GRPO at reward 0.03-0.06 and did not
# learn; at 800, seeds 0-3 start at 0.2-0.4 and GRPO raises it (tests/grpo/test_tool_task.py, docs/grpo.md).
WARMUP_STEPS = 800


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


TOOLS = [add]


def build_tool_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny character tokenizer with a tool-calling chat template, `<|im_end|>` as EOS (the end of an
    assistant turn) and the two tool-call tags as single (non-special, so decoded) tokens."""
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.eos_token = "<|im_end|>"
    return tokenizer


def prompts(n: int, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    pairs = [(rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)) for _ in range(n)]
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"{a}+{b}"}] for a, b in pairs],
            "answer": [str(a + b) for a, b in pairs],
        }
    )


def final_answer_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 when the last assistant message is exactly the answer."""
    out = []
    for messages, target in zip(completions, answer):
        last = [m for m in messages if m["role"] == "assistant"][-1]["content"].strip()
        out.append(1.0 if last == target else 0.0)
    return out


def _call(a: int, b: int) -> dict:
    return {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}


def teacher_conversation(a: int, b: int, rng: random.Random) -> list[dict]:
    """One noisy-teacher answer to "a+b": a direct wrong guess (1/2), a correct call (1/4), an off-by-one call."""
    user = {"role": "user", "content": f"{a}+{b}"}
    roll = rng.random()
    if roll < 0.5:
        guess = a + b + rng.choice([-10, -2, -1, 1, 2, 10])
        return [user, {"role": "assistant", "content": str(guess)}]
    b_used = b if roll < 0.75 else b + rng.choice([-1, 1])
    return [
        user,
        {"role": "assistant", "content": "", "tool_calls": [_call(a, b_used)]},
        {"role": "tool", "name": "add", "content": str(a + b_used)},
        {"role": "assistant", "content": str(a + b_used)},
    ]


def _encode(tokenizer, conversation: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of the whole chat and labels on the assistant turns only (-100 elsewhere)."""
    ids, labels = [], []
    prompt = tokenizer.apply_chat_template(conversation[:1], tools=TOOLS, add_generation_prompt=True, return_dict=False)
    ids, labels = list(prompt), [-100] * len(prompt)
    for i in range(1, len(conversation)):
        upto = tokenizer.apply_chat_template(
            conversation[: i + 1], tools=TOOLS, add_generation_prompt=conversation[i]["role"] == "tool",
            return_dict=False,
        )  # fmt: skip
        new = list(upto)[len(ids) :]
        if conversation[i]["role"] == "assistant":
            end = new.index(tokenizer.eos_token_id) + 1  # the turn up to its EOS; the newline after is template
            labels += new[:end] + [-100] * (len(new) - end)
        else:
            labels += [-100] * len(new)
        ids += new
    return ids, labels


def warm_up(
    model: PreTrainedModel, tokenizer, seed: int = 0, steps: int = WARMUP_STEPS, batch: int = 32, lr: float = 3e-3
):
    """Supervised warm-up on the noisy teacher. Returns the last batch's loss."""
    rng = random.Random(seed)
    rows = [_encode(tokenizer, teacher_conversation(rng.randint(LOW, HIGH), rng.randint(LOW, HIGH), rng))
            for _ in range(2000)]  # fmt: skip
    width = max(len(i) for i, _ in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in rows])
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        pick = torch.randint(0, ids.shape[0], (batch,), generator=generator)
        loss = model(input_ids=ids[pick], attention_mask=mask[pick], labels=labels[pick]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    return loss.item()


def build_calculator_model(
    seed: int = 0, warmup_steps: int = WARMUP_STEPS
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    tokenizer = build_tool_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed, **MODEL_KWARGS)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        warm_up(model, tokenizer, seed, warmup_steps)
    return model, tokenizer


def tool_call_json(a: int, b: int) -> str:
    return json.dumps({"name": "add", "arguments": {"a": a, "b": b}})
