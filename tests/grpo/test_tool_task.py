"""The built-in tool-calling task learns offline: GRPO raises the rate of correct calculator calls and the reward."""

import random

import pytest
import torch

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.tasks import calculator


def test_teacher_conversations_train_only_the_assistant_turns():
    tok = calculator.build_tool_tokenizer()
    rng = random.Random(0)
    conversation = next(c for c in (calculator.teacher_conversation(23, 58, rng) for _ in range(20)) if len(c) == 4)
    ids, labels = calculator._encode(tok, conversation)
    trained = tok.decode([i for i, lab in zip(ids, labels) if lab != -100])
    b = conversation[1]["tool_calls"][0]["function"]["arguments"]["b"]
    assert (
        trained
        == f'<tool_call>{{"name": "add", "arguments": {{"a": 23, "b": {b}}}}}</tool_call><|im_end|>{23 + b}<|im_end|>'
    )
    turns = [{"role": "assistant", "content": "x"}, {"role": "tool", "content": "81"}]
    turns.append({"role": "assistant", "content": "81"})
    assert calculator.final_answer_reward([turns], answer=["81"]) == [1.0]


@pytest.mark.slow  # ~4 min idle on a 2-core machine, the 800-step warm-up most of it
def test_grpo_learns_to_call_the_calculator(tmp_path):
    torch.set_num_threads(1)
    model, tok = calculator.build_calculator_model(seed=0)  # WARMUP_STEPS: 800
    # top_k=50: what this test was measured with (top_k=None reached generate as 50 until that was fixed; the
    # full vocabulary breaks this tiny model's JSON tool calls more often).
    # lr 5e-4 and an 800-step warm-up: at 1e-3 one GRPO seed in five collapsed (reward 0.10 -> 0.0, malformed calls
    # growing; the GPU machine's torch 2.11 run fell 0.16 -> 0.006), and a 400-step warm-up left model seeds 1 and 2
    # at reward 0.03-0.06 with nothing to learn from; now model seeds 0-3 rise by 0.34-0.46 (docs/grpo.md).
    args = GRPOConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, per_device_train_batch_size=32, num_generations=8,
        max_completion_length=80, max_prompt_length=64, learning_rate=5e-4, lr_scheduler_type="constant", max_steps=20,
        logging_steps=5, beta=0.0, temperature=1.0, top_k=50, save_strategy="no", disable_tqdm=True,
        max_tool_calling_iterations=1, seed=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model, reward_funcs=calculator.final_answer_reward, args=args, train_dataset=calculator.prompts(512),
        processing_class=tok, tools=calculator.TOOLS,
    )  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert logs[-1]["reward"] > logs[0]["reward"] + 0.15
    assert logs[-1]["tools/call_count"] > logs[0]["tools/call_count"]
