import pytest
import torch

from tests.ddpo.conftest import tiny_pipeline

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("peft")


def test_scheduler_step_equals_diffusers_on_the_pipeline_schedule():
    pipe = tiny_pipeline()
    scheduler = pipe.scheduler
    scheduler.set_timesteps(5)
    reference = diffusers.DDIMScheduler.from_config(scheduler.config)
    reference.set_timesteps(5)
    g = torch.Generator().manual_seed(0)
    sample = torch.randn(2, 4, 8, 8, generator=g)
    for t in scheduler.timesteps:
        model_output, noise = torch.randn(2, 2, 4, 8, 8, generator=g)
        ours = pipe.scheduler_step(model_output, t, sample, eta=1.0, noise=noise)
        theirs = reference.step(model_output, t, sample, eta=1.0, variance_noise=noise).prev_sample
        torch.testing.assert_close(ours.latents, theirs, atol=1e-6, rtol=0)
        assert ours.log_probs.shape == (2,) and torch.isfinite(ours.log_probs).all()
        sample = theirs


def test_sampling_records_every_step_and_rescoring_gives_the_same_log_probs():
    pipe = tiny_pipeline()
    embeds = torch.randn(3, 16, 32)
    out = pipe(
        prompt_embeds=embeds,
        num_inference_steps=3,
        guidance_scale=3.0,
        eta=1.0,
        generator=torch.Generator().manual_seed(0),
    )
    assert out.images.shape == (3, 3, 16, 16) and 0 <= out.images.min() and out.images.max() <= 1
    assert len(out.latents) == 4 and len(out.log_probs) == 3
    assert out.latents[0].shape == (3, 4, 8, 8)
    from replayrl.ddpo.pipeline import encode_prompts, guided_noise_pred

    negative = encode_prompts(pipe.sd_pipeline, [""] * 3, "cpu")
    with torch.no_grad():
        for j, t in enumerate(pipe.scheduler.timesteps):
            noise_pred = guided_noise_pred(pipe.unet, out.latents[j], t, embeds, negative, 3.0)
            step = pipe.scheduler_step(noise_pred, t, out.latents[j], eta=1.0, prev_sample=out.latents[j + 1])
            assert torch.equal(step.log_probs, out.log_probs[j])


def test_pipeline_from_a_path_and_bad_inputs(tmp_path):
    from replayrl.ddpo import DefaultDDPOStableDiffusionPipeline
    from replayrl.models.tiny_diffusion import build_tiny_sd_pipeline, save_tiny_sd_pipeline

    path = save_tiny_sd_pipeline(tmp_path / "tiny-sd")
    pipe = DefaultDDPOStableDiffusionPipeline(str(path), use_lora=False)
    assert isinstance(pipe.scheduler, diffusers.DDIMScheduler)
    assert len(pipe.get_trainable_layers()) == len(list(pipe.unet.parameters()))
    assert not any(p.requires_grad for p in pipe.vae.parameters())
    with pytest.raises(ValueError, match="expected a hub name"):
        DefaultDDPOStableDiffusionPipeline(42)
    sd = build_tiny_sd_pipeline()
    sd.scheduler = diffusers.DDIMScheduler.from_config(sd.scheduler.config, set_alpha_to_one=True)
    with pytest.raises(ValueError, match="set_alpha_to_one=False"):
        DefaultDDPOStableDiffusionPipeline(sd)


def test_lora_starts_as_identity_and_its_weights_load_into_diffusers(tmp_path):
    from replayrl.models.tiny_diffusion import build_tiny_sd_pipeline

    pipe = tiny_pipeline()
    base = build_tiny_sd_pipeline(0).unet
    x, t, e = torch.randn(2, 4, 8, 8), torch.tensor([10, 500]), torch.randn(2, 16, 32)
    with torch.no_grad():
        torch.testing.assert_close(
            pipe.unet(x, t, encoder_hidden_states=e).sample, base(x, t, encoder_hidden_states=e).sample
        )
    lora = pipe.get_trainable_layers()
    assert lora and all("lora" in n for n, p in pipe.unet.named_parameters() if p.requires_grad)
    with torch.no_grad():
        for p in lora:
            p.add_(0.05 * torch.randn_like(p))
        trained = pipe.unet(x, t, encoder_hidden_states=e).sample
    pipe.save_pretrained(tmp_path / "lora")
    assert (tmp_path / "lora" / "pytorch_lora_weights.safetensors").is_file()
    user = build_tiny_sd_pipeline(0)  # what a user does with the result
    user.load_lora_weights(str(tmp_path / "lora"))
    with torch.no_grad():
        torch.testing.assert_close(user.unet(x, t, encoder_hidden_states=e).sample, trained, atol=1e-6, rtol=0)
    fresh = tiny_pipeline()  # and resume: in place, into the existing adapter
    fresh.load_checkpoint(tmp_path / "lora")
    with torch.no_grad():
        torch.testing.assert_close(fresh.unet(x, t, encoder_hidden_states=e).sample, trained, atol=0, rtol=0)


def test_low_precision_latents_are_scored_as_stored():
    pipe = tiny_pipeline()
    pipe.scheduler.set_timesteps(4)
    g = torch.Generator().manual_seed(0)
    sample, model_output = torch.randn(2, 2, 4, 8, 8, generator=g).to(torch.bfloat16)
    t = pipe.scheduler.timesteps[1]
    step = pipe.scheduler_step(model_output, t, sample, eta=1.0, generator=g)
    assert step.latents.dtype == torch.bfloat16 and step.log_probs.dtype == torch.float32
    again = pipe.scheduler_step(model_output, t, sample, eta=1.0, prev_sample=step.latents)
    assert torch.equal(again.log_probs, step.log_probs)


def test_one_group_vae_unpins_the_colour_balance():
    """With one channel per GroupNorm group the decoder pins each colour's mean; with one group it does not."""
    import torch

    from replayrl.ddpo.pipeline import decode_latents
    from replayrl.ddpo.rewards import redness
    from replayrl.models.tiny_diffusion import build_tiny_sd_pipeline

    latents = torch.randn(16, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    spread = {}
    for groups in (8, 1):
        pipe = build_tiny_sd_pipeline(0, vae_norm_groups=groups)
        assert pipe.vae.config.norm_num_groups == groups
        with torch.no_grad():
            spread[groups] = redness(decode_latents(pipe, latents), None, None)[0].std().item()
    assert spread[1] > 3 * spread[8]
