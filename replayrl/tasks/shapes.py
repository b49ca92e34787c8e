"""Synthetic images for vision-language RL: one coloured shape per image, a question with a verifiable one-letter
answer. Made on the fly (PIL), nothing downloaded.

- ``"colour"``: "What colour is the shape?" -> ``R``, ``G`` or ``B`` (red, green or blue shape);
- ``"position"``: "Is the shape on the left or the right?" -> ``L`` or ``R``.

The answer depends on the image only (the question text is the same for every row), so a policy can only beat
chance by looking at the pixels. `shape_reward` scores the first letter of a completion.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from datasets import Dataset

COLOURS = {"R": (220, 30, 30), "G": (30, 200, 30), "B": (30, 30, 220)}
QUESTIONS = {
    "colour": "What colour is the shape? Answer R, G or B.",
    "position": "Is the shape on the left or the right? Answer L or R.",
}


def shape_image(colour: str, side: str, size: int, shape: str = "square"):
    """A ``size`` x ``size`` RGB image, grey background, one ``colour`` ("R", "G", "B") square or circle on the
    ``side`` ("L" or "R") half."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (128, 128, 128))
    draw = ImageDraw.Draw(image)
    half = size // 2
    x0 = 2 if side == "L" else half + 2
    box = (x0, size // 4, x0 + half - 4, size // 4 + half - 4)
    (draw.rectangle if shape == "square" else draw.ellipse)(box, fill=COLOURS[colour])
    return image


def shape_dataset(
    n: int = 32, size: int = 56, question: Literal["colour", "position"] = "colour", seed: int = 0
) -> Dataset:
    """``n`` rows: a conversational ``prompt`` (the question), an ``image`` (PIL) and the ``answer`` letter."""
    from datasets import Dataset

    if question not in QUESTIONS:
        raise ValueError(f"question={question!r}: use one of {sorted(QUESTIONS)}.")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        colour, side, shape = rng.choice("RGB"), rng.choice("LR"), rng.choice(["square", "circle"])
        answer = colour if question == "colour" else side
        rows.append((shape_image(colour, side, size, shape), answer))
    prompt = [{"role": "user", "content": QUESTIONS[question]}]
    return Dataset.from_dict(
        {"prompt": [prompt] * n, "image": [image for image, _ in rows], "answer": [a for _, a in rows]}
    )


def first_letter(completion) -> str:
    """The first non-space character of a completion (text, or conversational messages), upper-cased."""
    text = completion[-1]["content"] if isinstance(completion, list) else completion
    text = text.strip()
    return text[:1].upper()


def shape_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion starts with the right letter, else 0.0."""
    return [float(first_letter(c) == a) for c, a in zip(completions, answer)]
