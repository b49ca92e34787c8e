"""The built-in default job of `replayrl grpo`: a run that shows GRPO with a replay buffer learning, offline,
on a laptop CPU in a few minutes.

Task: single-digit addition, prompts "7+5=" (all 100 pairs), completion = the sum then end-of-text. The reward
is verifiable and binary: 1.0 if the completion is exactly the sum, else 0.0 (`exact_match`).

Policy: a tiny Qwen2 from `replayrl.tiny` (character tokenizer, random weights), warmed up for a few hundred
supervised steps on a *noisy teacher*: for every prompt the teacher writes WARMUP_SAMPLES answers, of which
only 1-3 are the true sum and the rest are near misses (sum +-1, +-2). The warmed-up policy therefore knows
the format and proposes plausible numbers, but is right only about a quarter of the time, and nothing in the
warm-up data says which of its candidates is the right one.

What the run demonstrates:
- learning is real: the only signal that singles out the correct sum is the 0/1 reward, so the success rate
  rising from ~0.25 to ~0.9 is reinforcement learning, not imitation;
- binary rewards make zero-std groups (all G completions wrong early on, all right late), which carry no
  advantage; `frac_reward_zero_std` climbs as the policy improves, and the replay buffer swaps those groups for
  stored informative ones, so `replay/frac_zero_std_trained` stays near 0.

Everything (data, warm-up, RL) is seeded: the same seed gives the same run.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from replayrl.builtin_rewards import exact_match
from replayrl.tiny import build_tiny_model, build_tokenizer

TASK_DESCRIPTION = "single-digit addition (a+b=), 0/1 exact-match reward, tiny Qwen2 warmed up on a noisy teacher"
MODEL_KWARGS = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}
WARMUP_SAMPLES = 8  # teacher answers per prompt
WARMUP_STEPS = 300
WARMUP_LR = 3e-3
WARMUP_BATCH = 64
NEAR_MISSES = (-2, -1, 1, 2)

# GRPO settings of the default job; a recipe file or command-line flags override any of them.
DEFAULT_CONFIG: dict[str, Any] = {
    "learning_rate": 5e-4,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "max_steps": 150,
    "per_device_train_batch_size": 64,
    "num_generations": 8,
    "max_prompt_length": 16,
    "max_completion_length": 4,
    "temperature": 1.0,
    "top_k": None,
    "beta": 0.04,
    "replay_buffer_size": 32,
    "logging_steps": 5,
    "save_steps": 50,
    "save_total_limit": 1,
}


def problems() -> list[tuple[int, int]]:
    return [(a, b) for a in range(10) for b in range(10)]


def task_dataset() -> Dataset:
    """The 100 addition prompts with their `answer` column (what `exact_match` compares against)."""
    pairs = problems()
    return Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in pairs], "answer": [str(a + b) for a, b in pairs]})


def task_reward():
    """The task's reward function: 1.0 for exactly the sum, else 0.0."""
    return exact_match


def teacher_examples(seed: int) -> list[tuple[str, str]]:
    """(prompt, answer) pairs from the noisy teacher: per prompt 1-3 correct answers out of WARMUP_SAMPLES."""
    rng = random.Random(seed)
    examples = []
    for a, b in problems():
        n_correct = rng.randint(1, 3)
        wrong = [max(0, a + b + rng.choice(NEAR_MISSES)) for _ in range(WARMUP_SAMPLES - n_correct)]
        examples += [(f"{a}+{b}=", str(s)) for s in [a + b] * n_correct + wrong]
    return examples


def _encode(tokenizer: PreTrainedTokenizerFast, examples: list[tuple[str, str]]) -> tuple[torch.Tensor, ...]:
    """input_ids (N, T), attention_mask (N, T), labels (N, T) with -100 on prompt and padding.

    Sequences are right-padded: every prompt has the same length, so positions match generation exactly.
    """
    rows = []
    for prompt, answer in examples:
        p = tokenizer(prompt, add_special_tokens=False).input_ids
        c = tokenizer(answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        rows.append((p + c, [-100] * len(p) + c))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r, _ in rows])
    return ids, mask, labels


def warm_up(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, seed: int, steps: int = WARMUP_STEPS) -> float:
    """Supervised warm-up on the noisy teacher (plain torch, seeded). Returns the last batch's loss."""
    ids, mask, labels = _encode(tokenizer, teacher_examples(seed))
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARMUP_LR, weight_decay=0.0)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        rows = torch.randint(0, ids.shape[0], (WARMUP_BATCH,), generator=generator)
        loss = model(input_ids=ids[rows], attention_mask=mask[rows], labels=labels[rows]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    return loss.item()


def build_default_model(seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Tokenizer and the warmed-up tiny policy; same seed, same weights."""
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed, **MODEL_KWARGS)
    with torch.random.fork_rng(devices=[]):  # dropout-free, but keep the caller's RNG untouched anyway
        warm_up(model, tokenizer, seed)
    model.config._name_or_path = "replayrl-tiny-adder"
    return model, tokenizer
