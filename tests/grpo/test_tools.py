"""Tool calling: parsing, execution, the chat-template suffix, and one train() step in which a scripted tool call
is executed, its result fed back, and the result's tokens get zero loss weight."""

import copy

import pytest
import torch

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.data.prompts import prompts_to_text, tool_schemas
from replayrl.grpo.tools import (
    accepts_completion_idx,
    parse_tool_calls,
    run_tool_calls,
    tool_suffix_ids,
    tools_by_name,
)
from tests.conftest import tiny_args

TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' and m.get('tool_calls') %}<|im_start|>assistant\n{{ m['content'] }}"
    "{% for c in m['tool_calls'] %}<tool_call>{{ c['function'] | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}<|im_start|>tool\n{{ m['content'] }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def add_with_idx(a: int, b: int, _completion_idx: int = -1) -> int:
    """Add two integers; the trainer says which completion called.

    Args:
        a: The first integer.
        b: The second integer.
        _completion_idx: The completion index, injected by the trainer.
    """
    CALLERS.append(_completion_idx)
    return a + b


CALLERS: list[int] = []


@pytest.fixture
def tool_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = TOOL_TEMPLATE
    tok.eos_token = "<|im_end|>"  # the end of an assistant turn, as chat models stop
    return tok


def test_parse_and_run_tool_calls(tool_tokenizer):
    calls = parse_tool_calls(tool_tokenizer, "ok " + CALL + ' <tool_call>{"name": "add", oops}</tool_call>')
    assert calls[0] == {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    assert "error" in calls[1]
    calls.append({"type": "function", "function": {"name": "mul", "arguments": {}}})
    messages, failures = run_tool_calls(calls, tools_by_name([add]))
    assert [m["content"] for m in messages][0] == "5" and failures == 2
    assert "not found" in messages[2]["content"] and messages[0]["role"] == "tool"
    assert parse_tool_calls(tool_tokenizer, "no call here") == []


def test_completion_idx_is_passed_only_to_tools_that_take_it():
    assert accepts_completion_idx(add_with_idx) and not accepts_completion_idx(add)
    CALLERS.clear()
    call = {"type": "function", "function": {"name": "add_with_idx", "arguments": {"a": 2, "b": 3}}}
    messages, failures = run_tool_calls([call], tools_by_name([add_with_idx]), completion_idx=7)
    assert messages[0]["content"] == "5" and failures == 0 and CALLERS == [7]
    plain = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    assert run_tool_calls([plain], tools_by_name([add]), completion_idx=7)[0][0]["content"] == "5"


def test_completion_idx_is_kept_out_of_the_schema_the_model_sees(tool_tokenizer):
    tok = copy.deepcopy(tool_tokenizer)
    tok.chat_template = "{{ tools | tojson }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    text = prompts_to_text(tok, [[{"role": "user", "content": "2+3?"}]], None, [add_with_idx])[0]
    assert '"a"' in text and '"b"' in text and "_completion_idx" not in text
    hidden, plain = tool_schemas([add_with_idx])[0]["function"], tool_schemas([add])[0]["function"]
    assert hidden["parameters"] == plain["parameters"]  # the same arguments as a tool without it


def test_tool_suffix_is_the_rendered_result_and_next_header(tool_tokenizer):
    suffix = tool_suffix_ids(tool_tokenizer, [{"role": "tool", "name": "add", "content": "5"}])
    assert tool_tokenizer.decode(suffix) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"


class ScriptedToolTrainer(GRPOTrainer):
    """The tiny model never calls a tool by itself: the first turn of every other row is replaced by a call."""

    call = CALL

    def _call_tools(self, prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, mode):
        scripted = self.processing_class(self.call + "<|im_end|>", add_special_tokens=False)["input_ids"]
        width = max(completion_ids.shape[1], len(scripted))
        ids = torch.full((completion_ids.shape[0], width), self.generation_config.pad_token_id)
        mask = torch.zeros_like(ids)
        ids[:, : completion_ids.shape[1]], mask[:, : completion_ids.shape[1]] = completion_ids, completion_mask
        for row in range(0, ids.shape[0], 2):
            ids[row], mask[row] = self.generation_config.pad_token_id, 0
            ids[row, : len(scripted)], mask[row, : len(scripted)] = torch.tensor(scripted), 1
            truncated[row] = False
        return super()._call_tools(prompt_ids, prompt_mask, ids, mask, truncated, mode)


def test_tool_results_are_fed_back_and_get_no_loss(model, tool_tokenizer, chat_dataset, tmp_path):
    seen = []

    def reward(completions, **kwargs):
        seen.extend(completions)
        return [float(len(str(c)) % 5) for c in completions]

    args = tiny_args(GRPOConfig, tmp_path, max_steps=1, max_completion_length=100, max_tool_calling_iterations=1)
    trainer = ScriptedToolTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=chat_dataset, processing_class=tool_tokenizer,
        tools=[add],
    )  # fmt: skip
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters()))
    assert trainer.state.log_history[0]["tools/call_count"] == 2  # rows 0 and 2 of the 4
    batch = trainer._micro_batches[0]
    suffix = tool_suffix_ids(tool_tokenizer, [{"role": "tool", "name": "add", "content": "5"}])
    for row in (0, 2):
        real = batch.completion_mask[row].bool()
        results = real & (batch.tool_mask[row] == 0)
        assert batch.completion_ids[row][results].tolist() == suffix  # the tool's answer, fed back
        assert batch.loss_weights[row][results].eq(0).all()  # ... and trained on with weight 0
        assert batch.loss_weights[row][real & (batch.tool_mask[row] == 1)].gt(0).all()  # the model's tokens
    assert batch.tool_mask[1].eq(1).all() and batch.tool_mask[3].eq(1).all()
    tool_turns = [m for c in seen for m in c if m["role"] == "tool"]
    assert [m["content"] for m in tool_turns] == ["5", "5"]
    assert seen[0][0]["tool_calls"][0]["function"]["name"] == "add"


class ScriptedIdxTrainer(ScriptedToolTrainer):
    """As ScriptedToolTrainer, calling `add_with_idx` (rows 0 and 2 of each batch call it)."""

    call = CALL.replace('"add"', '"add_with_idx"')


def test_train_tells_each_tool_call_its_completion_index(model, tool_tokenizer, chat_dataset, tmp_path):
    args = tiny_args(GRPOConfig, tmp_path, max_steps=1, max_completion_length=100, max_tool_calling_iterations=1)
    trainer = ScriptedIdxTrainer(
        model=model, reward_funcs=lambda completions, **kw: [float(len(str(c)) % 5) for c in completions],
        args=args, train_dataset=chat_dataset, processing_class=tool_tokenizer, tools=[add_with_idx, add],
    )  # fmt: skip
    assert trainer._tools_accept_completion_idx == {"add_with_idx": True, "add": False}
    CALLERS.clear()
    trainer.train()
    assert CALLERS == [0, 2]  # the rows that called, by their index in the generated batch
