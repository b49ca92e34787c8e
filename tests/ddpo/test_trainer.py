import json

import pytest
import torch

from replayrl.algos.diffusion import batch_advantages
from replayrl.metrics import read_metrics
from tests.ddpo.conftest import assert_same_runs, centre_brightness, tiny_trainer

pytest.importorskip("diffusers")
pytest.importorskip("peft")


def _train_records(run_dir):
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]


def test_ratio_is_exactly_one_before_the_first_update_and_loss_is_the_hand_value(tmp_path):
    seen = []
    trainer = tiny_trainer(
        tmp_path,
        hook=lambda data, step, tracker: seen.append(data),
        num_epochs=1,
        train_num_inner_epochs=2,
        train_adv_clip_max=0.5,
        train_learning_rate=1e-2,
    )
    trainer.train()
    first, second = _train_records(tmp_path / "run")
    # inner epoch 0: every micro-step precedes the optimizer step, so the policy is the sampling policy
    assert first["ratio"] == 1.0 and first["approx_kl"] == 0.0 and first["clipfrac"] == 0.0
    rewards = seen[0][0][3]
    expected = -batch_advantages(rewards).clamp(-0.5, 0.5).mean().item()
    assert expected != 0.0
    assert first["loss"] == pytest.approx(expected, abs=1e-6)
    assert second["ratio"] != 1.0  # inner epoch 1 runs after an update


def test_image_samples_hook_gets_images_prompts_and_rewards(tmp_path):
    calls = []
    trainer = tiny_trainer(
        tmp_path,
        hook=lambda data, step, tracker: calls.append((data, step, tracker)),
        sample_num_batches_per_epoch=2,
        num_epochs=2,
    )
    trainer.train()
    assert [step for _, step, _ in calls] == [0, 2]  # the global step when the epoch's samples were drawn
    data, _, tracker = calls[0]
    assert tracker is None and len(data) == 2
    images, prompts, prompt_metadata, rewards, reward_metadata = data[0]
    assert images.shape == (4, 3, 16, 16) and 0 <= images.min() and images.max() <= 1
    assert len(prompts) == 4 and prompt_metadata[0] == {"source": "test"}
    torch.testing.assert_close(rewards, centre_brightness(images, prompts, prompt_metadata)[0])
    assert reward_metadata == [{"prompt": p} for p in prompts]


def test_async_rewards_give_the_same_run(tmp_path, deterministic):
    runs = []
    for name, is_async in (("sync", False), ("async", True)):
        trainer = tiny_trainer(
            tmp_path / name,
            async_reward_computation=is_async,
            sample_num_batches_per_epoch=2,
            num_epochs=1,
            allow_tf32=False,
        )
        trainer.train()
        runs.append(read_metrics(tmp_path / name / "run" / "metrics.jsonl"))
    assert len(runs[0]) == 3  # 2 optimizer steps + 1 reward record
    assert_same_runs(runs[0], runs[1])


def test_resume_is_exact(tmp_path, deterministic):
    settings = dict(
        allow_tf32=False,
        num_epochs=2,
        save_freq=1,
        num_checkpoint_limit=1,
        per_prompt_stat_tracking=True,
        per_prompt_stat_tracking_buffer_size=4,
        per_prompt_stat_tracking_min_count=2,
        train_batch_size=2,
    )
    straight = tiny_trainer(tmp_path / "a", **settings)
    straight.train()
    interrupted = tiny_trainer(tmp_path / "b", **settings)
    interrupted.train(epochs=1)
    resumed = tiny_trainer(tmp_path / "b", resume_from=str(tmp_path / "b" / "run"), **settings)
    assert (resumed.first_epoch, resumed.global_step) == (1, 2)
    resumed.train()
    for p, q in zip(straight.trainable_layers, resumed.trainable_layers, strict=True):
        assert_same_runs(p, q)
    assert straight.stat_tracker.state_dict().keys() == resumed.stat_tracker.state_dict().keys()
    if not torch.cuda.is_available():  # the tracked rewards carry the GPU's rounding (assert_same_runs)
        assert straight.stat_tracker.state_dict() == resumed.stat_tracker.state_dict()
    records = [read_metrics(tmp_path / x / "run" / "metrics.jsonl") for x in "ab"]
    assert len(records[0]) == 6
    assert_same_runs(records[0], records[1])
    assert [p.name for p in (tmp_path / "b" / "run").glob("checkpoint-*")] == ["checkpoint-2"]  # limit 1
    marker = json.loads((tmp_path / "b" / "run" / "checkpoint-2" / "replayrl_complete.json").read_text())
    assert marker["trainer"] == "DDPOTrainer"


def test_resume_refuses_other_settings_and_fresh_runs_refuse_old_checkpoints(tmp_path):
    from replayrl.checkpoints import CheckpointError

    tiny_trainer(tmp_path, num_epochs=1, save_freq=1).train()
    with pytest.raises(CheckpointError, match="train_batch_size"):
        tiny_trainer(tmp_path, resume_from=str(tmp_path / "run"), train_batch_size=2)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        tiny_trainer(tmp_path)


def test_wrong_reward_count_and_pipeline_type_are_errors(tmp_path):
    from replayrl.ddpo import DDPOTrainer
    from tests.ddpo.conftest import prompt_fn, tiny_config

    trainer = tiny_trainer(tmp_path, reward=lambda images, prompts, meta: (torch.zeros(1), {}))
    with pytest.raises(ValueError, match="returned 1 rewards for 4 images"):
        trainer.train()
    with pytest.raises(ValueError, match="DefaultDDPOStableDiffusionPipeline"):
        DDPOTrainer(tiny_config(tmp_path / "x"), centre_brightness, prompt_fn, object())


@pytest.mark.parametrize("use_lora, lr", [(True, 3e-3), (False, 1e-5)])
def test_an_update_improves_the_surrogate_on_its_samples(tmp_path, use_lora, lr):
    # Inner epoch 0 trains at ratio 1; inner epoch 1 re-scores the same samples after that update: the PPO
    # surrogate -mean(A * ratio) must have gone down (first-order: the step follows its gradient).
    trainer = tiny_trainer(
        tmp_path,
        use_lora=use_lora,
        num_epochs=1,
        train_num_inner_epochs=3,
        train_learning_rate=lr,
        train_clip_range=0.5,
        sample_batch_size=8,
        train_batch_size=8,
    )
    trainer.train()
    losses = [r["loss"] for r in _train_records(tmp_path / "run")]
    assert losses[0] == pytest.approx(0.0, abs=1e-6)  # batch-normalised advantages at ratio 1
    assert losses[1] < -1e-4 and losses[2] < losses[1]


def test_optimizer_steps_follow_accumulation_and_timestep_fraction(tmp_path):
    # 2 batches of 4 samples -> 4 training batches of 2; 4 steps x 0.5 = 2 trained per sample; one optimizer
    # step per 2 batches x 2 timesteps = 4 micro-steps -> 2 optimizer steps per epoch.
    trainer = tiny_trainer(
        tmp_path,
        num_epochs=1,
        sample_num_steps=4,
        sample_num_batches_per_epoch=2,
        train_batch_size=2,
        train_gradient_accumulation_steps=2,
        train_timestep_fraction=0.5,
    )
    calls = []
    original = trainer.calculate_loss

    def counting(latents, timesteps, *rest):
        calls.append(timesteps.clone())
        return original(latents, timesteps, *rest)

    trainer.calculate_loss = counting
    trainer.train()
    assert trainer.global_step == 2 and len(_train_records(tmp_path / "run")) == 2
    assert len(calls) == 8 and all(t.shape == (2,) for t in calls)
    # each sample trains 2 distinct of its 4 timesteps
    assert set(torch.cat(calls).tolist()) <= set(trainer.sd_pipeline.scheduler.timesteps.tolist())


def test_trl_v071_generate_samples_per_batch_and_loss(tmp_path):
    """TRL v0.7.1's `_generate_samples(iterations, batch_size)` gives one sample dict per batch and the
    (images, prompts, ...) of each; `calculate_loss` takes one denoising step of them (ratio 1 before any update);
    `loss(advantages, clip_range, ratio)` is the clipped surrogate."""
    trainer = tiny_trainer(tmp_path, sample_batch_size=2, train_batch_size=2)
    samples, pairs = trainer._generate_samples(2, 2)
    assert len(samples) == 2 and len(pairs) == 2 and len(pairs[0][0]) == 2 and len(samples[0]["prompts"]) == 2
    sample = samples[0]
    assert sample["latents"].shape == (2, 3, 4, 8, 8) and sample["log_probs"].shape == (2, 3)
    embeds = torch.cat([trainer.neg_prompt_embed.expand(2, -1, -1), sample["prompt_embeds"]])
    keys = ("latents", "timesteps", "next_latents", "log_probs")
    loss, approx_kl, _ = trainer.calculate_loss(*(sample[k][:, 0] for k in keys), torch.tensor([1.0, -1.0]), embeds)
    assert trainer._last_ratio.item() == pytest.approx(1.0, abs=1e-4) and approx_kl.item() < 1e-6
    assert loss.item() == pytest.approx(0.0, abs=1e-4)  # mean(-A * 1) over A = (1, -1)
    assert trainer.loss(torch.tensor([-1.0]), 0.0001, torch.tensor([1.0])).item() == 1.0
    # ratio 2 with A = 1: clipped to 1.2 -> -1.2 is larger than -2; A = -1: -(-1) * 2 = 2 is the larger
    ratios, advantages = torch.tensor([2.0, 2.0]), torch.tensor([1.0, -1.0])
    assert trainer.loss(advantages, 0.2, ratios).item() == pytest.approx((-1.2 + 2.0) / 2)
