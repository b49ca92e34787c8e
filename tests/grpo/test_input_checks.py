"""Bad input gets a clear error at construction, naming the value and the fix, before any generation."""

import numpy as np
import pytest
import torch
from datasets import Dataset

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.rewards.functions import RewardFunctions
from tests.conftest import tiny_args


def reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def build(model, tokenizer, tmp_path, train, evaluation=None, funcs=reward, **overrides):
    args = tiny_args(GRPOConfig, tmp_path, **overrides)
    return GRPOTrainer(
        model=model,
        reward_funcs=funcs,
        args=args,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=tokenizer,
    )


def test_missing_or_empty_train_dataset_is_refused(model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="`train_dataset` is required unless an `environment_factory`"):
        build(model, tokenizer, tmp_path, None)  # as TRL 1.16, at construction
    with pytest.raises(ValueError, match="train_dataset is empty"):
        build(model, tokenizer, tmp_path, Dataset.from_dict({"prompt": []}))


def test_fewer_prompts_than_one_generation_batch_is_refused(model, tokenizer, tmp_path):
    few = Dataset.from_dict({"prompt": ["1+1=", "2+2="]})
    with pytest.raises(ValueError, match=r"has 2 prompts but one generation batch needs 4 .*0 steps"):
        build(model, tokenizer, tmp_path, few, per_device_train_batch_size=8, num_generations=2)


@pytest.mark.parametrize("bad", ["", "   ", []])
def test_empty_prompts_are_named_before_generation(model, tokenizer, tmp_path, bad):
    prompts = ["1+1=", "2+2=", bad, "3+3="] if bad != [] else [[{"role": "user", "content": "x"}]] * 3 + [[]]
    with pytest.raises(ValueError, match=r"empty prompt at row (2|3)"):
        build(model, tokenizer, tmp_path, Dataset.from_dict({"prompt": prompts}))


def test_eval_dataset_without_a_column_the_reward_reads_is_refused(model, tokenizer, tmp_path):
    def needs_answer(completions, answer, **kwargs):
        return [float(c == a) for c, a in zip(completions, answer)]

    def optional_answer(completions, answer=None, **kwargs):
        return [float(c == a) for c, a in zip(completions, answer)]

    train = Dataset.from_dict({"prompt": ["1+1=", "2+2="] * 4, "answer": ["2", "4"] * 4})
    evaluation = Dataset.from_dict({"prompt": ["3+3=", "4+4="] * 2})
    with pytest.raises(ValueError, match=r"'needs_answer' needs the column\(s\) \['answer'\], which eval_dataset"):
        build(model, tokenizer, tmp_path, train, evaluation, funcs=needs_answer)
    with pytest.raises(ValueError, match=r"eval_dataset lacks the column\(s\) \['answer'\]"):
        build(model, tokenizer, tmp_path, train, evaluation, funcs=optional_answer)
    with pytest.raises(ValueError, match=r"'needs_answer' needs the column\(s\) \['answer'\], which train_dataset"):
        build(model, tokenizer, tmp_path, evaluation, funcs=needs_answer)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("epsilon_high", -0.1, r"epsilon_high must be > 0 \(got -0.1\)"),
        ("epsilon", 0.0, r"epsilon must be > 0 \(got 0.0\)"),
        ("max_prompt_length", 0, r"max_prompt_length must be >= 1 or None .*got 0"),
        ("max_prompt_length", -5, r"got -5"),
    ],
)
def test_config_values_are_checked_with_the_value_named(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        tiny_args(GRPOConfig, tmp_path, **{field: value})


def test_numpy_and_tensor_rewards_are_accepted_as_in_trl():
    funcs = RewardFunctions([lambda completions, **kw: np.array([1.0, 0.5]), lambda **kw: torch.tensor([0, 1])])
    scores = funcs(["p", "q"], ["a", "b"], [[1], [2]], {})
    torch.testing.assert_close(scores, torch.tensor([[1.0, 0.0], [0.5, 1.0]]))
