"""GRPO and GRPO-with-replay through `train()` with vLLM colocate on CPU: the engine's weights follow the policy
(mismatch metric ~0 at every step), rewards and the mismatch metrics are logged, the policy learns, and replayed
groups keep the engine's log-probs."""

import pytest

from replayrl import GRPOConfig, GRPOTrainer, GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from replayrl.models.tiny import prompt_dataset
from tests.conftest import tiny_args


def digit_reward(completions, **kwargs):
    """Share of a completion's characters that are the digit 7: easy to learn for a character-level model."""
    return [c.count("7") / max(len(c), 1) for c in completions]


def _vllm_args(cls, tmp_path, **overrides):
    settings = dict(
        use_vllm=True,
        vllm_mode="colocate",
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        temperature=1.0,
        top_k=None,
        beta=0.0,
        learning_rate=3e-2,
        max_steps=4,
    )
    settings.update(overrides)
    return tiny_args(cls, tmp_path, **settings)


def _history(trainer, key):
    return [log[key] for log in trainer.state.log_history if key in log]


@pytest.fixture
def closing():
    trainers = []
    yield trainers.append
    for trainer in trainers:
        trainer.generator.close()


def test_grpo_colocate_trains_learns_and_keeps_engine_in_sync(tmp_path, vllm_model_dir, closing):
    args = _vllm_args(GRPOConfig, tmp_path, max_steps=12)
    trainer = GRPOTrainer(vllm_model_dir, digit_reward, args=args, train_dataset=prompt_dataset(48))
    closing(trainer)
    trainer.train()
    rewards = _history(trainer, "reward")
    assert len(rewards) == 12
    # the engine generated with the weights of the step it was called at: trainer and engine agree
    assert max(_history(trainer, "sampling/sampling_logp_difference/max")) < 1e-4
    assert min(_history(trainer, "sampling/importance_sampling_ratio/min")) > 0.999
    assert len(_history(trainer, "timing/weight_sync")) == 12
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.05, f"reward did not improve: {rewards}"


def test_replay_colocate_keeps_engine_logps_in_replayed_groups(tmp_path, vllm_model_dir, closing):
    args = _vllm_args(GRPOWithReplayBufferConfig, tmp_path, max_steps=4, replay_buffer_size=8)
    trainer = GRPOWithReplayBufferTrainer(vllm_model_dir, digit_reward, args=args, train_dataset=prompt_dataset(32))
    closing(trainer)
    trainer.train()
    assert len(_history(trainer, "reward")) == 4
    assert max(_history(trainer, "sampling/sampling_logp_difference/max")) < 1e-4
    assert trainer.replay_buffer.groups, "nothing reached the buffer"
    for group in trainer.replay_buffer.groups:
        rollout = group.rollout
        assert rollout.engine_logps is not None
        real = rollout.completion_mask.bool()
        assert not rollout.engine_logps[real].isnan().any()
