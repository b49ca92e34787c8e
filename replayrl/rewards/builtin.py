"""Built-in reward functions following TRL's reward-function convention.

A reward function is called with keyword arguments `prompts`, `completions`, `completion_ids` and one list per
extra dataset column (e.g. `answer`), and returns one float per completion, or None where it does not apply.
Completions are strings, or for conversational data lists of message dicts (see `completion_text`).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

RewardFunc = Callable[..., list[float | None]]

_BOXED_RE = re.compile(r"\\boxed\s*\{")
_LATEX_FRAC_RE = re.compile(r"(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}")
_THOUSANDS_RE = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")


def completion_text(completion: Any) -> str:
    """Text of one completion: a str as is, or the content of the last message of a message list (or dict)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)):
        if not completion:
            return ""
        completion = completion[-1]
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    raise TypeError(f"a completion must be a str or a list of message dicts, got {type(completion).__name__}")


def _content_text(content: Any) -> str:
    """Message content as text; multimodal content parts contribute their `text` fields."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    raise TypeError(f"message content must be a str or a list of parts, got {type(content).__name__}")


def _length_scores(completions: Sequence[Any], target: int | Sequence[int]) -> list[float | None]:
    """-abs(target - len(text)) per completion; `target` may be one int or one per completion."""
    if isinstance(target, Sequence) and not isinstance(target, str):
        targets = list(target)
    else:
        targets = [target] * len(completions)
    _check_aligned(completions, targets, "target")
    return [float(-abs(int(t) - len(completion_text(c)))) for c, t in zip(completions, targets)]


def reward_len(completions: Sequence[Any], target: int | Sequence[int] = 20, **kwargs: Any) -> list[float | None]:
    """Score -abs(target - len(text)) for each completion (TRL docs' example; best is 0 at exactly `target` chars).

    A dataset column named `target` arrives here as a list and is used per sample.
    """
    return _length_scores(completions, target)


def make_length_reward(target: int) -> RewardFunc:
    """Reward function named `length_{target}` scoring -abs(target - len(text)) for each completion."""
    if isinstance(target, bool) or not isinstance(target, int) or target < 0:
        raise ValueError(f"length target must be a non-negative int, got {target!r}")

    def length_reward(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        return _length_scores(completions, target)

    length_reward.__name__ = length_reward.__qualname__ = f"length_{target}"
    length_reward.__doc__ = f"Score -abs({target} - len(text)) for each completion."
    return length_reward


def make_regex_reward(pattern: str, name: str | None = None) -> RewardFunc:
    """Reward function scoring 1.0 if the whole text matches `pattern` (re.fullmatch, DOTALL) else 0.0."""
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except (re.error, TypeError) as err:
        raise ValueError(f"invalid regex pattern {pattern!r}: {err}") from err

    def regex_reward(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        return [1.0 if compiled.fullmatch(completion_text(c)) else 0.0 for c in completions]

    # The name becomes TRL's logged metric key, so derive a readable one from the pattern by default.
    slug = re.sub(r"\W+", "_", pattern).strip("_")[:32]
    regex_reward.__name__ = regex_reward.__qualname__ = name or (f"regex_{slug}" if slug else "regex")
    regex_reward.__doc__ = f"Score 1.0 if the completion fully matches {pattern!r} (DOTALL), else 0.0."
    return regex_reward


def _check_aligned(completions: Sequence[Any], column: Sequence[Any], column_name: str) -> None:
    """Raise if a per-sample column does not have one entry per completion."""
    if len(column) != len(completions):
        raise ValueError(f"got {len(completions)} completions but {len(column)} values in column {column_name!r}")


def _require_answers(func_name: str, completions: Sequence[Any], answer: Sequence[Any] | None) -> Sequence[Any]:
    """The `answer` column, or a ValueError explaining how to provide it."""
    if answer is None:
        raise ValueError(
            f"reward {func_name!r} needs an 'answer' column in the dataset (one reference answer per prompt); "
            "map yours with e.g. dataset.rename_column('solution', 'answer')"
        )
    if isinstance(answer, str):
        raise ValueError(f"reward {func_name!r} expects 'answer' as a list with one entry per completion, got a str")
    _check_aligned(completions, answer, "answer")
    return answer


def exact_match(completions: Sequence[Any], answer: Sequence[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """Score 1.0 if text.strip() == str(answer).strip() else 0.0; None where the answer is None."""
    answers = _require_answers("exact_match", completions, answer)
    return [
        None if ref is None else float(completion_text(c).strip() == str(ref).strip())
        for c, ref in zip(completions, answers)
    ]


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text` (nested braces allowed); None if absent or left unclosed."""
    matches = list(_BOXED_RE.finditer(text))
    if not matches:
        return None
    start = pos = matches[-1].end()
    depth = 1
    while pos < len(text):
        char = text[pos]
        if char == "\\":
            pos += 2  # an escaped char such as \{ or \} never opens or closes a group
            continue
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return text[start:pos]
        pos += 1
    # A truncated final box is no answer: falling back to an earlier box would reward intermediate results.
    return None


def reference_answer(answer: Any) -> str:
    """Final answer from a reference: its last \\boxed{} (MATH), the text after `####` (GSM8K), or the whole."""
    text = str(answer)
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        return text.rsplit("####", 1)[1]
    return text


def _normalize(text: str) -> str:
    """Drop whitespace and `$`, and unify \\dfrac/\\tfrac to \\frac, for string comparison."""
    text = re.sub(r"\s+", "", text.replace("$", ""))
    return re.sub(r"\\[dt]frac", r"\\frac", text)


def _to_number(text: str) -> Fraction | None:
    """Exact value of an int, float, `a/b` or `\\frac{a}{b}` (thousands commas allowed), else None."""
    if _THOUSANDS_RE.fullmatch(text):
        text = text.replace(",", "")
    frac = _LATEX_FRAC_RE.fullmatch(text)
    if frac:
        sign, numerator, denominator = -1 if frac[1] else 1, int(frac[2]), int(frac[3])
        return sign * Fraction(numerator, denominator) if denominator else None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def answers_match(predicted: str, reference: str) -> bool:
    """Whether two final answers agree, as normalised strings or as equal numbers ("0.5" == "1/2")."""
    pred, ref = _normalize(predicted), _normalize(reference)
    if pred == ref:
        return True
    pred_num, ref_num = _to_number(pred), _to_number(ref)
    return pred_num is not None and ref_num is not None and pred_num == ref_num


def boxed_match(completions: Sequence[Any], answer: Sequence[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """Score 1.0 if the completion's last \\boxed{} equals the reference answer, else 0.0 (no box scores 0.0).

    References may be plain ("1/2"), boxed MATH solutions or GSM8K "... #### 42" texts; comparison ignores
    whitespace and `$` and treats equal numbers as equal. None where the answer is None.
    """
    answers = _require_answers("boxed_match", completions, answer)
    scores: list[float | None] = []
    for completion, ref in zip(completions, answers):
        if ref is None:
            scores.append(None)
            continue
        predicted = extract_boxed(completion_text(completion))
        scores.append(float(predicted is not None and answers_match(predicted, reference_answer(ref))))
    return scores


exact_match.required_columns = ("answer",)  # read by the trainer's dataset check
boxed_match.required_columns = ("answer",)

BUILTIN_REWARDS: dict[str, RewardFunc] = {"length": reward_len, "exact_match": exact_match, "boxed": boxed_match}


def get_reward(spec: str) -> RewardFunc:
    """Resolve a reward spec: a builtin name, "length:<int>", "regex:<pattern>", "module.sub:function" or
    "module.sub.function"."""
    if not isinstance(spec, str):
        raise TypeError(f"reward spec must be a str, got {type(spec).__name__}")
    name, sep, arg = spec.partition(":")
    name = name.strip()
    if name == "length" and sep:
        try:
            return make_length_reward(int(arg))
        except ValueError as err:
            raise ValueError(f"bad length reward spec {spec!r}: expected 'length:<non-negative int>'") from err
    if name == "regex" and sep:
        if not arg:
            raise ValueError(f"bad regex reward spec {spec!r}: expected 'regex:<pattern>'")
        return make_regex_reward(arg)  # the pattern is kept verbatim: colons and spaces are part of it
    if name in BUILTIN_REWARDS:
        if sep:
            raise ValueError(f"reward {name!r} takes no argument, got {spec!r}")
        return BUILTIN_REWARDS[name]
    if sep and name and arg.strip():
        return _import_reward(name, arg.strip())
    if not sep and "." in name.strip(".") and " " not in name:  # my_rewards.accuracy, as TRL's CLI
        module, _, attr = name.rpartition(".")
        return _import_reward(module, attr)
    valid = ", ".join(
        [*BUILTIN_REWARDS, "length:<target>", "regex:<pattern>", "'package.module:function'", "'module.function'"]
    )
    raise ValueError(f"unknown reward {spec!r}; valid: {valid}")


def _import_reward(module_name: str, attr_path: str) -> RewardFunc:
    """Import `attr_path` (dotted attributes allowed) from `module_name`, checking it is callable."""
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import module {module_name!r} for reward '{module_name}:{attr_path}': {err}") from err
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError as err:
            raise ValueError(f"module {module_name!r} has no attribute {attr_path!r}") from err
    if not callable(obj):
        raise ValueError(f"reward '{module_name}:{attr_path}' is not callable (got {type(obj).__name__})")
    return obj
