import pytest

from replayrl import GRPOConfig, GRPOWithReplayBufferConfig


def make(**kw):
    base = dict(output_dir="/tmp/replayrl-test-config", report_to="none", use_cpu=True)
    base.update(kw)
    return GRPOConfig(**base)


def test_seed_defaults():
    cfg = make()
    assert cfg.learning_rate == 1e-6 and cfg.beta == 0.04 and cfg.num_generations == 8
    assert cfg.max_prompt_length == 512 and cfg.max_completion_length == 256 and cfg.temperature == 0.9
    assert cfg.epsilon == 0.2 and cfg.epsilon_high == 0.2 and cfg.num_iterations == 1
    assert cfg.remove_unused_columns is False and cfg.scale_rewards == "group" and cfg.loss_type == "dapo"
    assert cfg.steps_per_generation == cfg.gradient_accumulation_steps == 1
    assert cfg.generation_batch_size == cfg.per_device_train_batch_size == 8


@pytest.mark.parametrize("value,expected", [(True, "group"), (False, "none"), ("batch", "batch"), ("none", "none")])
def test_scale_rewards_aliases(value, expected):
    assert make(scale_rewards=value).scale_rewards == expected


def test_generation_batch_derivation():
    cfg = make(per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=2)
    assert cfg.steps_per_generation == 2 and cfg.generation_batch_size == 8
    cfg = make(per_device_train_batch_size=4, num_generations=4, generation_batch_size=16)
    assert cfg.steps_per_generation == 4


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_generations=1, per_device_train_batch_size=4), "num_generations must be >= 2"),
        (dict(num_generations=3, per_device_train_batch_size=4), "not divisible by num_generations=3"),
        (dict(loss_type="ppo"), "loss_type must be one of"),
        (dict(scale_rewards="sometimes"), "scale_rewards must be one of"),
        (dict(generation_batch_size=10, per_device_train_batch_size=4), "generation_batch_size"),
        (dict(generation_batch_size=8, steps_per_generation=2), "not both"),
        (dict(beta=-1.0), "beta must be >= 0"),
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(top_p=1.5), "top_p"),
    ],
)
def test_bad_config_is_a_clear_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


def test_replay_config_defaults_and_checks():
    cfg = GRPOWithReplayBufferConfig(output_dir="/tmp/x", report_to="none", use_cpu=True)
    assert cfg.replay_buffer_size == 64 and cfg.replay_score == "adv_std"
    assert GRPOWithReplayBufferConfig(output_dir="/tmp/x", replay_buffer_size=0).replay_buffer_size == 0
    with pytest.raises(ValueError, match="replay_buffer_size must be >= 0"):
        GRPOWithReplayBufferConfig(output_dir="/tmp/x", replay_buffer_size=-1)
    with pytest.raises(ValueError, match="replay_score"):
        GRPOWithReplayBufferConfig(output_dir="/tmp/x", replay_score="best")
    with pytest.raises(ValueError, match="replay_max_age"):
        GRPOWithReplayBufferConfig(output_dir="/tmp/x", replay_max_age=0)
