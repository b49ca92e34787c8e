"""The built-in default job of `replayrl grpo` (no model, no dataset): GRPO with a replay buffer visibly
learning, offline, on two CPU cores in under a minute.

Task: single-digit addition. Prompts are "7+5=" (80 of the 100 pairs for training, 20 held out for
evaluation); a completion is the sum followed by end-of-text. The reward is verifiable and binary: 1.0 if the
completion is exactly the sum, else 0.0 (`exact_match` against the `answer` column).

Policy: a tiny Qwen2 from `replayrl.models.tiny` (character tokenizer, random weights, 130k parameters), given a few
seconds of supervised warm-up on a *noisy teacher*: for every one of the 100 prompts the teacher writes
WARMUP_SAMPLES answers, of which only 1 to 3 are the true sum and the rest near misses (sum +-1, +-2). The
warmed-up policy knows the format and proposes plausible numbers but is right only about a quarter of the
time, and nothing in its training data says which of its candidates is the right one.

What the run demonstrates (seed 0):
- learning is real: only the 0/1 reward singles out the correct sum, so the success rate rising from ~0.3 to
  ~0.9 is reinforcement learning, not imitation; and the reward on the 20 held-out prompts, which RL never
  trains on, rises too (0.24 at step 0 -> ~0.7), so the policy learns to add rather than memorising answers;
- binary rewards make zero-std groups (all G completions wrong early on, all right later), whose advantages
  are all 0. `frac_reward_zero_std` climbs from ~0.05 to ~0.8 as the policy improves, while the replay buffer
  adds, for each of them, G stored rollouts that beat their own group (the default `replay_placement="append"`,
  `replay_unit="rollout"`; the zero-std fresh groups stay, so `replay/frac_zero_std_trained` is ~0.3 on average;
  with "replace" it stays at 0).

Deterministic under `--seed`: data split, teacher, warm-up and RL sampling all derive from it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from replayrl.rewards.builtin import RewardFunc, exact_match

if TYPE_CHECKING:  # the CLI reads this module's settings for --help: keep transformers' models out of it
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

TASK_DESCRIPTION = "single-digit addition a+b=, 0/1 exact-match reward, tiny Qwen2 warmed up on a noisy teacher"
MODEL_KWARGS = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}
WARMUP_SAMPLES = 8  # teacher answers per prompt
WARMUP_STEPS = 300
WARMUP_LR = 3e-3
WARMUP_BATCH = 64
NEAR_MISSES = (-2, -1, 1, 2)
HELD_OUT = 20  # of the 100 pairs, kept out of RL training and used for evaluation
MAX_OPERAND = 9  # operands are 0..MAX_OPERAND

# GRPO settings of the default job (chosen by sweeping lr, batch, steps and buffer age for a clear curve);
# a recipe file or command-line flags override any of them.
DEFAULT_CONFIG: dict[str, Any] = {
    "learning_rate": 1e-3,  # 5e-3 collapses onto wrong answers; 5e-4 needs twice the steps
    "lr_scheduler_type": "constant",
    "max_steps": 500,  # ~0.9 on the training prompts; a 1000-step run lost held-out reward as entropy collapsed
    "per_device_train_batch_size": 128,  # 16 prompts x G=8 completions per step
    "num_generations": 8,
    "max_prompt_length": 16,
    "max_completion_length": 4,
    "temperature": 1.0,  # sample the policy as it is: its spread over candidates is what RL works on
    "top_k": None,
    "beta": 0.04,  # GRPO default: a frozen reference and a k3 KL term (the KL panel of the plot)
    "replay_buffer_size": 32,
    # Without an age bound the buffer keeps its top-scoring groups from the first steps and replays them
    # 20+ times, far off-policy; with it, replayed groups are ~5 steps old and the held-out curve is cleaner.
    "replay_max_age": 10,
    "logging_steps": 10,
    "eval_strategy": "steps",
    "eval_steps": 50,
    "eval_on_start": True,  # the held-out baseline at step 0
    "per_device_eval_batch_size": HELD_OUT * 8,  # every held-out prompt, G completions each, in one batch
    "save_steps": 250,
    "save_total_limit": 1,
}


def problems() -> list[tuple[int, int]]:
    """Every (a, b) operand pair, in a fixed order."""
    return [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]


def task_datasets(seed: int = 0) -> tuple[Dataset, Dataset]:
    """(train, held_out) prompt sets with an `answer` column (what `exact_match` compares against).

    HELD_OUT pairs never appear in RL training; their reward shows whether RL taught addition or only the
    answers of the training prompts. (The warm-up teacher covers all pairs, equally noisily.)
    """
    pairs = problems()
    random.Random(seed).shuffle(pairs)
    return _pairs_dataset(pairs[HELD_OUT:]), _pairs_dataset(pairs[:HELD_OUT])


def _pairs_dataset(pairs: list[tuple[int, int]]) -> Dataset:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in pairs], "answer": [str(a + b) for a, b in pairs]})


def task_reward() -> RewardFunc:
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


def warm_up(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    seed: int,
    steps: int = WARMUP_STEPS,
    examples: list[tuple[str, str]] | None = None,
) -> float:
    """Supervised warm-up on the noisy teacher (plain torch, seeded), or on `examples` ((prompt, completion) pairs).
    Returns the last batch's loss."""
    ids, mask, labels = _encode(tokenizer, teacher_examples(seed) if examples is None else examples)
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
    from replayrl.models.tiny import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed, **MODEL_KWARGS)
    with torch.random.fork_rng(devices=[]):  # dropout-free, but keep the caller's RNG untouched anyway
        warm_up(model, tokenizer, seed)
    model.config._name_or_path = "replayrl-tiny-adder"
    return model, tokenizer


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread, then restore the caller's setting.

    The default model is so small that splitting its matrix products across threads buys nothing, and on a
    busy 2-core machine the threads' spin-waiting made the same run 10x slower (measured: 60 s vs 6 s for
    100 steps while another process held one core).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
