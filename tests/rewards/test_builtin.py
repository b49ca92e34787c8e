"""Tests for the built-in reward functions and the reward-spec resolver."""

from __future__ import annotations

import pytest

from replayrl.rewards.builtin import (
    BUILTIN_REWARDS,
    answers_match,
    boxed_match,
    completion_text,
    exact_match,
    extract_boxed,
    get_reward,
    make_length_reward,
    make_regex_reward,
    reference_answer,
    reward_len,
)


def conv(text: str) -> list[dict[str, str]]:
    """A conversational completion as TRL passes it."""
    return [{"role": "assistant", "content": text}]


# --- completion_text ---------------------------------------------------------------------------------------------


def test_completion_text_forms():
    assert completion_text("abc") == "abc"
    assert completion_text(conv("abc")) == "abc"
    assert completion_text([{"role": "assistant", "content": "a"}, {"role": "tool", "content": "b"}]) == "b"
    assert completion_text({"role": "assistant", "content": "x"}) == "x"
    assert completion_text([]) == ""
    assert completion_text([{"role": "assistant", "content": None}]) == ""
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}]
    assert completion_text(parts) == "hi there"


@pytest.mark.parametrize("bad", [None, 3, ["not a message"], [{"content": 5}]])
def test_completion_text_rejects_bad_inputs(bad):
    with pytest.raises(TypeError):
        completion_text(bad)


# --- length ------------------------------------------------------------------------------------------------------


def test_reward_len_default_target():
    assert reward_len(completions=["a" * 20, "a" * 15, "a" * 27, ""]) == [0.0, -5.0, -7.0, -20.0]


def test_reward_len_custom_target_conversational_and_extra_kwargs():
    scores = reward_len(
        prompts=["p", "q"], completions=[conv("abc"), "abcdef"], completion_ids=[[1], [2]], task=["x", "y"], target=4
    )
    assert scores == [-1.0, -2.0]
    assert all(isinstance(s, float) for s in scores)


def test_reward_len_per_sample_target_column():
    assert reward_len(completions=["ab", "abcd"], target=[2, 1]) == [0.0, -3.0]
    with pytest.raises(ValueError, match="target"):
        reward_len(completions=["ab", "abcd"], target=[2])


def test_make_length_reward():
    fn = make_length_reward(5)
    assert fn.__name__ == "length_5"
    assert fn(completions=["abcde", conv("ab"), "abcdefgh"], prompts=["", "", ""]) == [0.0, -3.0, -3.0]
    # A dataset column named `target` must not override the fixed target.
    assert fn(completions=["abcde"], target=[100]) == [0.0]


@pytest.mark.parametrize("bad", [-1, 2.5, "10", True])
def test_make_length_reward_rejects_bad_target(bad):
    with pytest.raises(ValueError):
        make_length_reward(bad)


# --- regex -------------------------------------------------------------------------------------------------------


def test_regex_reward_fullmatch_dotall():
    fn = make_regex_reward(r"<think>.*</think>\s*\d+")
    completions = [
        "<think>a\nb</think> 42",
        "<think>a</think> 42 extra",
        "prefix <think>a</think>1",
        conv("<think></think>7"),
    ]
    assert fn(completions=completions) == [1.0, 0.0, 0.0, 1.0]


def test_regex_reward_names():
    assert make_regex_reward(r"\d+", name="digits").__name__ == "digits"
    assert make_regex_reward(r"<answer>.*</answer>").__name__ == "regex_answer_answer"
    assert make_regex_reward(r".*").__name__ == "regex"


@pytest.mark.parametrize("bad", ["(unclosed", "[a-", "*x"])
def test_regex_reward_invalid_pattern(bad):
    with pytest.raises(ValueError, match=r"invalid regex pattern") as err:
        make_regex_reward(bad)
    assert repr(bad) in str(err.value)


# --- exact_match -------------------------------------------------------------------------------------------------


def test_exact_match():
    completions = [" 42\n", "42.0", conv("Paris "), "x", "7"]
    answers = ["42", "42", " Paris", "y", 7]
    assert exact_match(completions=completions, answer=answers, prompts=[""] * 5) == [1.0, 0.0, 1.0, 0.0, 1.0]


def test_exact_match_none_answer_is_not_scored():
    assert exact_match(completions=["a", "b"], answer=["a", None]) == [1.0, None]


def test_exact_match_missing_answer_column():
    with pytest.raises(ValueError, match=r"'answer' column.*rename_column"):
        exact_match(completions=["a"], prompts=["p"])


def test_exact_match_misaligned_or_str_answer():
    with pytest.raises(ValueError, match="2 completions but 1"):
        exact_match(completions=["a", "b"], answer=["a"])
    with pytest.raises(ValueError, match="list"):
        exact_match(completions=["a"], answer="a")


# --- boxed -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{42}", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"first \boxed{1} then \boxed{2}.", "2"),
        (r"\boxed {x^{2}+\sqrt{3}}", r"x^{2}+\sqrt{3}"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),
        (r"\boxed{}", ""),
        ("no box here", None),
        (r"\boxed{1} and a truncated \boxed{\frac{1}{2}", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72"),
        (r"The answer is $\boxed{\frac{3}{4}}$.", r"\frac{3}{4}"),
        (" 5 ", " 5 "),
        (12, "12"),
    ],
)
def test_reference_answer(answer, expected):
    assert reference_answer(answer).strip() == expected.strip()


@pytest.mark.parametrize(
    "pred, ref, expected",
    [
        ("42", " 42 ", True),
        ("$42$", "42", True),
        ("x + 1", "x+1", True),
        ("0.5", "1/2", True),
        (r"\frac{1}{2}", "0.5", True),
        (r"\dfrac{1}{2}", r"\frac{1}{2}", True),
        (r"-\frac{3}{4}", "-0.75", True),
        ("3.0", "3", True),
        ("1,000", "1000", True),
        ("1/0", "0", False),
        ("0.33", "1/3", False),
        ("41", "42", False),
        ("abc", "abd", False),
    ],
)
def test_answers_match(pred, ref, expected):
    assert answers_match(pred, ref) is expected


def test_boxed_match_plain_and_conversational():
    completions = [
        r"Thus \boxed{72}",
        conv(r"The value is \boxed{\frac{1}{2}}."),
        r"\boxed{0.5}",
        "72",  # no box: not an answer
        r"\boxed{71}",
    ]
    answers = ["72", "1/2", r"$\boxed{\frac{1}{2}}$", "72", "#### 72"]
    assert boxed_match(completions=completions, answer=answers) == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_boxed_match_gsm8k_answers():
    gsm8k = "She has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"
    scores = boxed_match(completions=[r"\boxed{7}", r"\boxed{ 7 }", r"\boxed{8}"], answer=[gsm8k] * 3, task=["g"] * 3)
    assert scores == [1.0, 1.0, 0.0]


def test_boxed_match_none_and_missing_answer():
    assert boxed_match(completions=[r"\boxed{1}", r"\boxed{1}"], answer=[None, "1"]) == [None, 1.0]
    with pytest.raises(ValueError, match="'answer' column"):
        boxed_match(completions=[r"\boxed{1}"])


# --- registry / get_reward ---------------------------------------------------------------------------------------


def test_registry():
    assert BUILTIN_REWARDS == {"length": reward_len, "exact_match": exact_match, "boxed": boxed_match}
    assert get_reward("length") is reward_len
    assert get_reward("exact_match") is exact_match
    assert get_reward(" boxed") is boxed_match


def test_get_reward_length_target():
    fn = get_reward("length:30")
    assert fn.__name__ == "length_30"
    assert fn(completions=["a" * 25]) == [-5.0]


def test_get_reward_regex_keeps_colons_in_pattern():
    fn = get_reward(r"regex:Answer: \d+")
    assert fn(completions=["Answer: 12", "Answer 12"]) == [1.0, 0.0]


def test_get_reward_import_path():
    assert get_reward("replayrl.rewards.builtin:boxed_match") is boxed_match
    assert get_reward("os.path:join") is not None


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nope", r"unknown reward 'nope'; valid: length, exact_match, boxed, length:<target>, regex:<pattern>"),
        ("", "unknown reward"),
        ("regex", "unknown reward"),
        ("length:abc", "length:<non-negative int>"),
        ("length:-3", "length:<non-negative int>"),
        ("length:", "length:<non-negative int>"),
        ("regex:", "regex:<pattern>"),
        ("regex:(", "invalid regex pattern"),
        ("boxed:1", "takes no argument"),
        ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
        ("replayrl.rewards.builtin:nope", "has no attribute 'nope'"),
        ("replayrl.rewards.builtin:BUILTIN_REWARDS", "not callable"),
        ("replayrl.rewards.builtin:", "unknown reward"),
    ],
)
def test_get_reward_errors(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        get_reward(spec)


def test_get_reward_rejects_non_str():
    with pytest.raises(TypeError):
        get_reward(reward_len)  # type: ignore[arg-type]
