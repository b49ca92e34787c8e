"""Tool calling during GRPO rollouts (TRL's `GRPOTrainer(tools=[...])`): multi-turn completions whose tool results
are fed back to the model and masked out of the loss.

One rollout row: the model generates a turn; if the turn calls tools, each call is executed, the results are
rendered with the chat template as `tool` messages (plus the next assistant header) and appended, and the model
continues from there, up to `max_tool_calling_iterations` times or until the completion budget
(`max_completion_length`) is spent. The completion is then [turn 1][tool results][turn 2]...; `tool_mask` is 0 on
the tool-result tokens (not the model's actions, so no loss and no ratio) and 1 elsewhere.

Parsing: the tokenizer's `response_template` (`tokenizer.parse_response`) when it has one, else the Hermes/Qwen
format ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` that most tool-calling chat templates emit.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from replayrl.data.prompts import TRAINER_TOOL_ARGUMENTS

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def tools_by_name(tools: list[Callable] | None) -> dict[str, Callable]:
    """Python functions by name; each needs a docstring with typed arguments for the chat template's schema."""
    out = {}
    for tool in tools or []:
        if not callable(tool):
            raise ValueError(f"tools must be Python functions (got {tool!r}).")
        name = getattr(tool, "__name__", None)
        if not name or name in out:
            raise ValueError(f"tools need distinct __name__s (got {name!r} twice or none).")
        out[name] = tool
    return out


def parse_tool_calls(tokenizer, text: str) -> list[dict]:
    """Tool calls in a generated turn, as chat-template messages' ``tool_calls`` entries:
    ``[{"type": "function", "function": {"name": str, "arguments": dict}}]``. Malformed calls are returned with
    an ``"error"`` key so the model gets the error back as the tool result."""
    if getattr(tokenizer, "response_template", None) is not None:
        message = tokenizer.parse_response(text, prefix="")
        return list(message.get("tool_calls") or [])
    calls = []
    for raw in _TOOL_CALL.findall(text):
        try:
            payload = json.loads(raw)
            name, arguments = payload["name"], payload.get("arguments", {})
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            calls.append({"type": "function", "function": {"name": name, "arguments": arguments}})
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            calls.append({"type": "function", "function": {"name": "unknown", "arguments": {}}, "error": str(err)})
    return calls


COMPLETION_IDX = TRAINER_TOOL_ARGUMENTS[0]  # TRL's `_completion_idx`, hidden from the tool schemas


def accepts_completion_idx(tool: Callable) -> bool:
    """Whether `tool` takes TRL's ``_completion_idx`` argument (then each call is told which completion made it)."""
    return COMPLETION_IDX in inspect.signature(tool).parameters


def run_tool_calls(
    calls: list[dict], tools: dict[str, Callable], completion_idx: int | None = None
) -> tuple[list[dict], int]:
    """Execute the calls; returns the `tool` messages (results, or ``{"error": ...}``) and the failure count.
    A tool with a ``_completion_idx`` parameter gets ``completion_idx`` (the calling row's index in its batch)."""
    messages, failures = [], 0
    for call in calls:
        function = call.get("function", {})
        name = function.get("name", "unknown")
        try:
            if "error" in call:
                raise ValueError(f"could not parse the tool call: {call['error']}")
            if name not in tools:
                raise ValueError(f"tool {name!r} not found; available: {sorted(tools)}")
            arguments = dict(function.get("arguments", {}))
            if completion_idx is not None and accepts_completion_idx(tools[name]):
                arguments[COMPLETION_IDX] = completion_idx
            result = tools[name](**arguments)
            if inspect.iscoroutine(result):
                import asyncio

                result = asyncio.run(result)
        except Exception as err:  # noqa: BLE001 - any tool failure is reported back to the model
            failures += 1
            result = {"error": str(err)}
        messages.append({"role": "tool", "name": name, "content": str(result)})
    return messages, failures


def tool_suffix_ids(tokenizer, tool_messages: list[dict], chat_template_kwargs: dict | None = None) -> list[int]:
    """Token ids that follow an assistant turn ending in EOS when ``tool_messages`` are appended: the rendered
    tool results plus the next assistant header (TRL's method: render a dummy conversation with and without the
    tool messages and keep the difference, the prefix cut after its last EOS)."""
    kwargs = dict(chat_template_kwargs or {})
    call = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": call}]
    prefix = tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=False, **kwargs)
    full = tokenizer.apply_chat_template(
        dummy + tool_messages, tokenize=True, add_generation_prompt=True, return_dict=False, **kwargs
    )
    prefix, full = list(prefix), list(full)
    eos = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if eos:
        prefix = prefix[: eos[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise ValueError(
            "The chat template renders the conversation with tool results differently from the one without them, "
            "so the tool-result tokens cannot be appended to a completion. Use a template whose tool messages "
            "follow the assistant turn."
        )
    return full[len(prefix) :]


@dataclass
class ToolRollout:
    """One row's multi-turn completion. ``ids``: every completion token; ``tool_mask``: 0 on tool results;
    ``messages``: the assistant/tool messages, as TRL passes conversational completions to reward functions."""

    ids: list[int]
    tool_mask: list[int]
    messages: list[dict] = field(default_factory=list)
    truncated: bool = False


def run_tool_loop(
    tokenizer,
    tools: dict[str, Callable] | list[dict[str, Callable]],
    prompt_ids: list[list[int]],
    completions: list[list[int]],
    truncated: list[bool],
    generate: Callable[[list[list[int]]], tuple[list[list[int]], list[bool]]],
    max_completion_length: int,
    max_iterations: int | None = None,
    chat_template_kwargs: dict | None = None,
) -> tuple[list[ToolRollout], dict[str, float]]:
    """Continue every row whose last turn calls a tool (a tool taking ``_completion_idx`` is passed the row's
    index). ``completions``: first-turn ids per row (real tokens only); ``generate(id_lists) -> (new turns,
    truncated flags)`` samples one turn from each full context. Returns the rows and counters
    (``tools/call_count``, ``tools/failure_count``). ``tools``: one dict for every row, or a list of one dict per
    row (environments: each row calls its own environment's methods)."""
    rows = [ToolRollout(list(c), [1] * len(c), [_assistant(tokenizer, c)], t) for c, t in zip(completions, truncated)]
    stats = {"tools/call_count": 0.0, "tools/failure_count": 0.0}
    pending = [i for i, r in enumerate(rows) if _calls(tokenizer, r)]
    iteration = 0
    while pending and (max_iterations is None or iteration < max_iterations):
        contexts, active = [], []
        for i in pending:
            calls = _calls(tokenizer, rows[i])
            results, failures = run_tool_calls(calls, tools[i] if isinstance(tools, list) else tools, i)
            stats["tools/call_count"] += len(calls)
            stats["tools/failure_count"] += failures
            suffix = tool_suffix_ids(tokenizer, results, chat_template_kwargs)
            if len(rows[i].ids) + len(suffix) >= max_completion_length:
                rows[i].truncated = True  # no room for the results and an answer: stop here
                continue
            rows[i].ids += suffix
            rows[i].tool_mask += [0] * len(suffix)
            rows[i].messages += results
            contexts.append(prompt_ids[i] + rows[i].ids)
            active.append(i)
        if not active:
            break
        turns, cut = generate(contexts)
        for i, turn, was_cut in zip(active, turns, cut):
            room = max_completion_length - len(rows[i].ids)
            rows[i].truncated = was_cut or len(turn) > room
            turn = turn[:room]
            rows[i].ids += turn
            rows[i].tool_mask += [1] * len(turn)
            rows[i].messages.append(_assistant(tokenizer, turn))
        pending = [i for i in active if not rows[i].truncated and _calls(tokenizer, rows[i])]
        iteration += 1
    return rows, stats


def _assistant(tokenizer, ids: list[int]) -> dict[str, Any]:
    text = tokenizer.decode(ids, skip_special_tokens=True)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    calls = parse_tool_calls(tokenizer, text)
    if calls:
        message["tool_calls"] = calls
    return message


def _calls(tokenizer, row: ToolRollout) -> list[dict]:
    return row.messages[-1].get("tool_calls") or []


class ToolCallingMixin:
    """GRPOTrainer's tool-calling rollout (a mixin of the trainer: uses its model, tokenizer, args, _metrics)."""

    def _call_tools(self, prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, mode: str):
        """Run the tool loop on a generated batch. Returns ``(completion_ids, completion_mask, truncated,
        tool_mask, messages)``; without tools the batch passes through with ``tool_mask = messages = None``."""
        if not self.tools:
            return completion_ids, completion_mask, truncated, None, None
        prompts = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask)]
        firsts = [ids[m.bool()].tolist() for ids, m in zip(completion_ids, completion_mask)]
        rows, stats = run_tool_loop(
            self.processing_class,
            self._tools_per_row(),
            prompts,
            firsts,
            truncated.tolist(),
            self._generate_turn,
            self.args.max_completion_length,
            self.args.max_tool_calling_iterations,
            self.args.chat_template_kwargs,
        )
        totals = self.accelerator.reduce(torch.tensor(list(stats.values()), device=completion_ids.device), "sum")
        for key, value in zip(stats, totals.tolist()):
            self._metrics[mode][key].append(value)
        calls, failures = totals.tolist()  # TRL's rates: calls per rollout, failures per call
        self._metrics[mode]["tools/call_frequency"].append(calls / (len(rows) * self.accelerator.num_processes))
        self._metrics[mode]["tools/failure_frequency"].append(failures / calls if calls else 0.0)
        device, n = completion_ids.device, len(rows)
        width = max(1, max(len(r.ids) for r in rows))
        ids = torch.full((n, width), self.generation_config.pad_token_id, dtype=torch.long, device=device)
        mask = torch.zeros((n, width), dtype=torch.long, device=device)
        tool_mask = torch.ones((n, width), dtype=torch.long, device=device)
        for i, row in enumerate(rows):
            ids[i, : len(row.ids)] = torch.tensor(row.ids, dtype=torch.long)
            mask[i, : len(row.ids)] = 1
            tool_mask[i, : len(row.ids)] = torch.tensor(row.tool_mask, dtype=torch.long)
        cut = torch.tensor([r.truncated for r in rows], device=device)
        return ids, mask, cut, tool_mask, [r.messages for r in rows]

    def _tools_per_row(self):
        """Hook: the tools of every row (a dict), or one dict per row (see `run_tool_loop`)."""
        return self._tools

    def _generate_turn(self, contexts: list[list[int]]) -> tuple[list[list[int]], list[bool]]:
        """One more assistant turn for each full context (prompt + completion so far), left-padded."""
        from replayrl.generation.hf import generate_completions

        pad = self.generation_config.pad_token_id
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), pad, dtype=torch.long, device=self.accelerator.device)
        mask = torch.zeros_like(ids)
        for i, context in enumerate(contexts):
            ids[i, width - len(context) :] = torch.tensor(context, dtype=torch.long)
            mask[i, width - len(context) :] = 1
        policy = self.accelerator.unwrap_model(self.model)
        out, out_mask, cut = generate_completions(policy, ids, mask, self.generation_config)
        return [row[m.bool()].tolist() for row, m in zip(out, out_mask)], cut.tolist()
