"""The built-in vision-language job of `replayrl grpo --vlm` (no model, no dataset): GRPO with a replay buffer
teaching a tiny VLM to read a colour off an image, offline, on CPU in a few minutes.

Task: each image (made on the fly, `replayrl.tasks.shapes`) holds one red, green or blue square or circle on the
left or right; the prompt is always "What colour is the shape? Answer R, G or B." and the reward is 1.0 when the
completion starts with the right letter (`shape_reward`). The question is the same for every row, so only the
pixels tell the answer.

Policy: a tiny Qwen2-VL (`replayrl.models.tiny_vlm`, random weights, ~150k parameters) given a few seconds of
supervised warm-up on a teacher that answers R, G or B *at random*: the warmed-up policy knows the format (one
letter, then end-of-text) but is right a third of the time. Whatever it learns beyond 1/3 comes from the reward
through the image: the success rate climbing towards 1, on training images and on held-out ones RL never trains
on, is the model learning to look.

Deterministic under `--seed`: images, warm-up and RL sampling all derive from it.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import torch

from replayrl.tasks.shapes import QUESTIONS, shape_dataset, shape_reward

if TYPE_CHECKING:
    from datasets import Dataset

TASK_DESCRIPTION = "read the colour (R/G/B) of a shape off a 56x56 image, 0/1 reward, tiny Qwen2-VL warmed up at random"
FAMILY = "qwen2_vl"
TRAIN_IMAGES, HELD_OUT_IMAGES = 96, 24
WARMUP_STEPS, WARMUP_BATCH, WARMUP_LR = 60, 32, 3e-3

# GRPO settings of the job; a recipe file or command-line flags override any of them.
DEFAULT_CONFIG: dict[str, Any] = {
    "learning_rate": 1e-3,  # 3e-3 collapsed onto one letter on seed 2
    "lr_scheduler_type": "constant",
    "max_steps": 100,
    "per_device_train_batch_size": 64,  # 8 images x G=8 completions per step
    "num_generations": 8,
    "max_prompt_length": None,  # prompts with images are never truncated
    "max_completion_length": 2,  # a letter and end-of-text
    "temperature": 1.0,
    "top_k": None,
    "beta": 0.0,
    "replay_buffer_size": 16,
    "replay_max_age": 10,
    "logging_steps": 5,
    "eval_strategy": "steps",
    "eval_steps": 20,
    "eval_on_start": True,
    "per_device_eval_batch_size": HELD_OUT_IMAGES * 8,
    "save_steps": 100,
    "save_total_limit": 1,
}


def task_datasets(seed: int = 0) -> tuple[Dataset, Dataset]:
    """(train, held_out): images with an `answer` letter; the held-out images are never trained on."""
    return shape_dataset(TRAIN_IMAGES, seed=seed), shape_dataset(HELD_OUT_IMAGES, seed=seed + 10_000)


def task_reward():
    return shape_reward


def warm_up(model, processor, seed: int, steps: int = WARMUP_STEPS) -> float:
    """Supervised warm-up on a teacher that answers R, G or B at random whatever the image (plain torch, seeded):
    the format, not the task. Returns the last batch's loss."""
    from replayrl.data.vision import prepare_multimodal_messages

    rng = random.Random(seed)
    images = shape_dataset(WARMUP_BATCH, seed=seed + 20_000)["image"]
    messages = prepare_multimodal_messages([{"role": "user", "content": QUESTIONS["colour"]}], 1)
    prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    tokenizer = processor.tokenizer
    enc = processor(text=[prompt + "R" + tokenizer.eos_token] * len(images), images=[[i] for i in images],
                    return_tensors="pt", add_special_tokens=False)  # fmt: skip
    letters = torch.tensor(tokenizer.convert_tokens_to_ids(list("RGB")))
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARMUP_LR, weight_decay=0.0)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        ids = enc["input_ids"].clone()
        ids[:, -2] = letters[torch.tensor([rng.randrange(3) for _ in images])]  # a random answer per image
        labels = torch.full_like(ids, -100)
        labels[:, -2:] = ids[:, -2:]  # the letter and end-of-text
        loss = model(**{**enc, "input_ids": ids}, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    return loss.item()


def build_default_model(seed: int = 0):
    """The warmed-up tiny Qwen2-VL and its processor; same seed, same weights."""
    from replayrl.models.tiny_vlm import build_tiny_processor, build_tiny_vlm

    processor = build_tiny_processor(FAMILY)
    model = build_tiny_vlm(FAMILY, seed=seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        warm_up(model, processor, seed)
    model.config._name_or_path = "replayrl-tiny-vlm-colours"
    return model, processor
