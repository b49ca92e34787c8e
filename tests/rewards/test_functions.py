"""The reward-function convention, unit level (RewardFunctions) and through `trainer.train()`."""

import asyncio
import math

import pytest
import torch

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.models.tiny import build_tiny_sequence_classifier
from replayrl.rewards.functions import RewardFunctions
from tests.conftest import tiny_args


def call(funcs, n=4, weights=None, **columns):
    rf = RewardFunctions(funcs, weights=weights)
    return rf, rf(["p"] * n, ["c" * i for i in range(n)], [[1]] * n, columns)


def test_weighted_sum_ignores_none():
    def a(completions, **kw):
        return [1.0, None, 2.0, None]

    def b(completions, **kw):
        return [10.0, 20.0, None, None]

    rf, per_func = call([a, b], weights=[1.0, 0.5])
    assert torch.allclose(per_func[:2], torch.tensor([[1.0, 10.0], [math.nan, 20.0]]), equal_nan=True)
    total = rf.combine(per_func)
    assert total[:3].tolist() == [6.0, 10.0, 2.0] and math.isnan(total[3])  # row 3: no function applies


def test_async_reward_functions_run_concurrently():
    started = []

    async def slow(completions, **kw):
        started.append(len(started))
        await asyncio.sleep(0.2)
        return [1.0] * len(completions)

    async def slow2(completions, **kw):
        started.append(len(started))
        await asyncio.sleep(0.2)
        return [2.0] * len(completions)

    import time

    t0 = time.perf_counter()
    _, per_func = call([slow, slow2])
    assert time.perf_counter() - t0 < 0.35  # concurrent, not 0.4 s in sequence
    assert per_func[:, 1].tolist() == [2.0] * 4


@pytest.mark.parametrize(
    "returned,match",
    [
        ([1.0, 2.0], "returned 2 rewards, but 4 were expected"),
        ("oops", "must return a list of 4 floats"),
        ([1.0, "x", 2.0, 3.0], "returned 'x'"),
        ([1.0, float("nan"), 2.0, 3.0], "must be finite"),
        ([1.0, float("inf"), 2.0, 3.0], "must be finite"),
    ],
)
def test_bad_reward_returns_are_clear_errors(returned, match):
    def bad(completions, **kw):
        return returned

    with pytest.raises(ValueError, match=match):
        call(bad)


def test_reward_weights_length_checked():
    with pytest.raises(ValueError, match="reward_weights has 1 entries but there are 2"):
        RewardFunctions([len, len], weights=[1.0])


def test_reward_model_scores_text(tokenizer):
    rm = build_tiny_sequence_classifier(tokenizer)
    rf = RewardFunctions(rm, processing_classes=tokenizer)
    scores = rf(["a", "b"], ["x", "yy"], [[1], [1]], {})
    assert scores.shape == (2, 1) and torch.isfinite(scores).all()


def test_extra_columns_and_conventions_arrive_through_train(model, tokenizer, dataset, tmp_path):
    seen = {}

    def spy(prompts, completions, completion_ids, answer, task, trainer_state, **kwargs):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, answer=answer, task=task)
        seen["state"] = trainer_state
        return [float(len(c)) for c in completions]

    args = tiny_args(GRPOConfig, tmp_path, max_steps=1)
    GRPOTrainer(model=model, reward_funcs=spy, args=args, train_dataset=dataset, processing_class=tokenizer).train()
    assert len(seen["completions"]) == 4 and len(seen["answer"]) == 4 and len(seen["task"]) == 4
    assert isinstance(seen["completions"][0], str) and isinstance(seen["ids"][0], list)
    assert seen["prompts"][0] == seen["prompts"][3]  # one prompt, G=4 completions
    assert seen["answer"][0] in dataset["answer"] and seen["state"] is not None


def test_all_none_rewards_warn_and_train_on_or_raise_when_asked(model, tokenizer, dataset, tmp_path, caplog):
    def never(completions, **kw):
        return [None] * len(completions)

    args = tiny_args(GRPOConfig, tmp_path, max_steps=1, logging_steps=1)
    trainer = GRPOTrainer(model=model, reward_funcs=never, args=args, train_dataset=dataset, processing_class=tokenizer)
    with caplog.at_level("WARNING"):
        trainer.train()  # TRL's behaviour: a warning naming the sample, zero advantages, no update from the policy term
    assert "All reward functions returned None for the following kwargs:" in caplog.text
    assert trainer.state.global_step == 1 and trainer.state.log_history[0]["loss"] == 0.0

    args = tiny_args(GRPOConfig, tmp_path / "strict", max_steps=1, on_unscored_batch="raise")
    trainer = GRPOTrainer(model=model, reward_funcs=never, args=args, train_dataset=dataset, processing_class=tokenizer)
    with pytest.raises(ValueError, match="returned None for every completion"):
        trainer.train()


def test_reward_model_by_path_in_training(model, tokenizer, dataset, tmp_path):
    rm_dir = tmp_path / "rm"
    rm = build_tiny_sequence_classifier(tokenizer)
    rm.save_pretrained(rm_dir)
    tokenizer.save_pretrained(rm_dir)
    args = tiny_args(GRPOConfig, tmp_path, max_steps=1)
    trainer = GRPOTrainer(
        model=model, reward_funcs=str(rm_dir), args=args, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.train()
    assert "rewards/rm/mean" in trainer.state.log_history[0]


def test_bools_and_numpy_scalars_are_accepted():
    import numpy as np

    def mixed(completions, **kw):
        return [True, False, np.float32(0.5), 2]

    _, per_func = call(mixed)
    assert per_func[:, 0].tolist() == [1.0, 0.0, 0.5, 2.0]
