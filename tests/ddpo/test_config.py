import pytest

from replayrl.ddpo import DDPOConfig

SEED_DEFAULTS = dict(
    run_name="",
    seed=42,
    logdir="logs",
    log_with=None,
    tracker_project_name="trl",
    num_epochs=100,
    save_freq=1,
    num_checkpoint_limit=5,
    mixed_precision="fp16",
    allow_tf32=True,
    resume_from="",
    sample_num_steps=50,
    sample_eta=1.0,
    sample_guidance_scale=5.0,
    sample_batch_size=1,
    sample_num_batches_per_epoch=2,
    train_batch_size=1,
    train_use_8bit_adam=False,
    train_learning_rate=3e-4,
    train_adam_beta1=0.9,
    train_adam_beta2=0.999,
    train_adam_weight_decay=1e-4,
    train_adam_epsilon=1e-8,
    train_gradient_accumulation_steps=1,
    train_max_grad_norm=1.0,
    train_num_inner_epochs=1,
    train_cfg=True,
    train_adv_clip_max=5,
    train_clip_range=1e-4,
    train_timestep_fraction=1.0,
    per_prompt_stat_tracking=False,
    per_prompt_stat_tracking_buffer_size=16,
    per_prompt_stat_tracking_min_count=16,
    async_reward_computation=False,
    max_workers=2,
    negative_prompts="",
)


def test_seed_defaults():
    config = DDPOConfig()
    for name, value in SEED_DEFAULTS.items():
        assert getattr(config, name) == value, name
    assert config.tracker_kwargs == {} and config.accelerator_kwargs == {} and config.project_kwargs == {}
    assert config.num_train_timesteps == 50


def test_sample_batch_must_split_into_train_batches():
    with pytest.raises(ValueError, match=r"sample_batch_size=6 is not a multiple of train_batch_size=4"):
        DDPOConfig(sample_batch_size=6, train_batch_size=4)
    with pytest.raises(ValueError, match="train_batch_size=2"):  # larger train batch than sample batch
        DDPOConfig(sample_batch_size=1, train_batch_size=2)


def test_epoch_must_split_into_optimizer_steps():
    # 4 * 3 = 12 samples per epoch, 2 * 5 = 10 per optimizer step
    with pytest.raises(ValueError, match=r"12 images.*= 10.*divisor of 6"):
        DDPOConfig(
            sample_batch_size=4, sample_num_batches_per_epoch=3, train_batch_size=2, train_gradient_accumulation_steps=5
        )
    DDPOConfig(
        sample_batch_size=4, sample_num_batches_per_epoch=3, train_batch_size=2, train_gradient_accumulation_steps=3
    )


def test_process_count_enters_the_arithmetic():
    config = DDPOConfig(
        sample_batch_size=2, sample_num_batches_per_epoch=3, train_batch_size=2, train_gradient_accumulation_steps=3
    )
    config.check(num_processes=2)  # 12 samples, 12 per step
    config.train_gradient_accumulation_steps = 4
    with pytest.raises(ValueError, match="train_gradient_accumulation_steps"):
        config.check(num_processes=2)  # 12 samples, 16 per step


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sample_eta=0.0), "sample_eta=0.0: must be > 0"),
        (dict(train_timestep_fraction=1.5), "train_timestep_fraction=1.5"),
        (dict(sample_num_steps=4, train_timestep_fraction=0.2), "trains 0 steps"),
        (dict(sample_guidance_scale=1.0), "set train_cfg=False"),
        (dict(mixed_precision="fp8"), "mixed_precision='fp8'"),
        (dict(per_prompt_stat_tracking=True, per_prompt_stat_tracking_min_count=32), "lower min_count"),
        (dict(train_batch_size=0), "train_batch_size=0: must be >= 1"),
    ],
)
def test_bad_values_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DDPOConfig(**kwargs)


def test_guidance_one_without_train_cfg_is_fine_and_json_kwargs_parse():
    config = DDPOConfig(sample_guidance_scale=1.0, train_cfg=False, tracker_kwargs='{"wandb": {"name": "x"}}')
    assert config.tracker_kwargs == {"wandb": {"name": "x"}}
    assert DDPOConfig(sample_num_steps=10, train_timestep_fraction=0.5).num_train_timesteps == 5


def test_mixed_precision_none_as_trl_v071_tests_pass_it_trains_in_full_precision(tmp_path):
    """TRL v0.7.1's own DDPO tests pass `mixed_precision=None` (accelerate's default): read as 'no'."""
    import torch

    from tests.ddpo.conftest import tiny_trainer

    assert DDPOConfig(mixed_precision=None).mixed_precision == "no"
    trainer = tiny_trainer(tmp_path, mixed_precision=None, num_epochs=1)
    assert trainer.accelerator.mixed_precision == "no"
    assert trainer.sd_pipeline.unet.dtype == torch.float32
    trainer.train()
