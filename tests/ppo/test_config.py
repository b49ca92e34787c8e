"""PPOConfig: TRL v0.7.1's defaults and fix-it errors."""

import pytest

from replayrl.ppo import PPOConfig


def test_seed_defaults():
    c = PPOConfig()
    assert (c.steps, c.learning_rate, c.adap_kl_ctrl, c.init_kl_coef, c.kl_penalty) == (20000, 1e-5, True, 0.2, "kl")
    assert (c.target, c.horizon, c.gamma, c.lam, c.cliprange, c.cliprange_value) == (6, 10000, 1, 0.95, 0.2, 0.2)
    assert (c.vf_coef, c.batch_size, c.mini_batch_size, c.gradient_accumulation_steps, c.ppo_epochs) == (
        0.1,
        256,
        1,
        1,
        4,
    )
    assert (c.early_stopping, c.target_kl, c.ratio_threshold, c.seed, c.tracker_project_name) == (
        False,
        0.1,
        10.0,
        0,
        "trl",
    )
    assert (c.use_score_scaling, c.use_score_norm, c.score_clip, c.max_grad_norm) == (False, False, None, None)
    assert c.backward_batch_size == 1 and c.total_ppo_epochs == 79  # ceil(20000 / 256)


def test_backward_batch_size():
    c = PPOConfig(batch_size=32, mini_batch_size=4, gradient_accumulation_steps=2)
    assert c.backward_batch_size == 8


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch_size": 10, "mini_batch_size": 4}, r"batch_size=10 is not divisible .* 4 \* 1 = 4"),
        ({"batch_size": 16, "mini_batch_size": 4, "gradient_accumulation_steps": 3}, "not divisible"),
        ({"kl_penalty": "k3"}, "kl_penalty='k3'"),
        ({"use_score_norm": True}, "use_score_scaling=True"),
        ({"score_clip": 0.0}, "score_clip=0.0"),
        ({"gamma": 1.5}, r"gamma=1.5 must be in \[0, 1\]"),
        ({"lam": -0.1}, "lam=-0.1"),
        ({"batch_size": 0}, "batch_size=0 must be a positive integer"),
        ({"ppo_epochs": 0}, "ppo_epochs=0"),
        ({"learning_rate": 0}, "learning_rate=0"),
        ({"cliprange": -0.2}, "cliprange=-0.2"),
        ({"target": 0}, "target=0"),
        ({"max_grad_norm": 0}, "max_grad_norm=0"),
        ({"temperature": 0}, "temperature=0"),
        ({"save_steps": 0}, "save_steps=0"),
    ],
)
def test_bad_values_raise_with_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PPOConfig(**kwargs)


def test_forward_batch_size_is_deprecated_for_mini_batch_size():
    with pytest.warns(FutureWarning, match="mini_batch_size"):
        c = PPOConfig(batch_size=8, forward_batch_size=4)
    assert c.mini_batch_size == 4
