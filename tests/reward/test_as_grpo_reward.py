"""A model trained by RewardTrainer plugs into GRPO as `reward_funcs="path/to/rm"`."""

import pytest

from replayrl import GRPOConfig, GRPOTrainer, RewardTrainer
from replayrl.models.tiny import build_tiny_model, build_tiny_sequence_classifier
from replayrl.rewards.functions import RewardFunctions
from replayrl.tasks.preferences import preference_datasets
from tests.conftest import tiny_args
from tests.reward.test_trainer import SMALL, rm_args


@pytest.fixture(scope="module")
def trained_rm(tmp_path_factory, tokenizer):
    out = tmp_path_factory.mktemp("rm")
    data = preference_datasets(seed=0, per_problem=2, rejected="near_miss")[0].select(range(32))
    args = rm_args(out, max_steps=80, logging_steps=80, learning_rate=1e-2)
    trainer = RewardTrainer(
        build_tiny_sequence_classifier(tokenizer, **SMALL), args=args, train_dataset=data, processing_class=tokenizer
    )
    trainer.train()
    trainer.save_model(str(out / "rm"))
    return str(out / "rm"), data


def test_grpo_scoring_keeps_the_learnt_preference(trained_rm):
    path, data = trained_rm
    funcs = RewardFunctions([path])
    prompts = list(data["prompt"]) * 2
    completions = list(data["chosen"]) + list(data["rejected"])
    scores = funcs(prompts, completions, [[0]] * len(prompts), {})[:, 0]
    n = len(data)
    accuracy = (scores[:n] > scores[n:]).float().mean().item()
    assert accuracy >= 0.75


def test_grpo_trains_with_the_reward_model_path(trained_rm, tokenizer, dataset, tmp_path):
    path, _ = trained_rm
    policy = build_tiny_model(tokenizer, **SMALL)
    trainer = GRPOTrainer(
        model=policy, reward_funcs=path, args=tiny_args(GRPOConfig, tmp_path), train_dataset=dataset,
        processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    logged = [k for r in trainer.state.log_history for k in r if k.startswith("rewards/") and k.endswith("/mean")]
    assert logged
