import math

import pytest
import torch

from replayrl.algos.diffusion import (
    PerPromptStatTracker,
    batch_advantages,
    ddim_alphas,
    ddim_step_with_logprob,
    ddpo_clipped_loss,
    gaussian_log_prob,
)


def _scheduler(**overrides):
    diffusers = pytest.importorskip("diffusers")
    kwargs = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False)
    kwargs.update(set_alpha_to_one=False, steps_offset=1)
    kwargs.update(overrides)
    scheduler = diffusers.DDIMScheduler(**kwargs)
    scheduler.set_timesteps(10)
    return scheduler


def _alphas(scheduler, t: int):
    timesteps = torch.tensor([t])
    prev = timesteps - scheduler.config.num_train_timesteps // scheduler.num_inference_steps
    return ddim_alphas(scheduler.alphas_cumprod, scheduler.final_alpha_cumprod, timesteps, prev)


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample"])
@pytest.mark.parametrize("eta", [1.0, 0.5])
def test_ddim_step_equals_diffusers_at_every_step(prediction_type, eta):
    scheduler = _scheduler(prediction_type=prediction_type, clip_sample=prediction_type == "sample")
    g = torch.Generator().manual_seed(0)
    sample = torch.randn(3, 4, 8, 8, generator=g)
    for t in scheduler.timesteps:  # the last step uses final_alpha_cumprod (prev timestep < 0)
        model_output, noise = torch.randn(2, 3, 4, 8, 8, generator=g)
        expected = scheduler.step(model_output, t, sample, eta=eta, variance_noise=noise).prev_sample
        a_t, a_prev = _alphas(scheduler, int(t))
        clip = scheduler.config.clip_sample_range if scheduler.config.clip_sample else None
        prev, log_prob = ddim_step_with_logprob(
            model_output, sample, a_t, a_prev, eta, noise=noise, prediction_type=prediction_type, clip_sample_range=clip
        )
        torch.testing.assert_close(prev, expected, atol=1e-6, rtol=0)
        assert log_prob.shape == (3,)
        sample = expected


def test_last_step_uses_final_alpha_cumprod():
    scheduler = _scheduler()
    last = int(scheduler.timesteps[-1])
    assert last - 100 < 0
    _, a_prev = _alphas(scheduler, last)
    assert a_prev.item() == pytest.approx(scheduler.final_alpha_cumprod.item())
    assert scheduler.final_alpha_cumprod.item() == pytest.approx(1 - 0.00085)  # alphas_cumprod[0], not 1


def test_log_prob_equals_normal_with_hand_sigma():
    scheduler = _scheduler()
    t = int(scheduler.timesteps[3])
    a_t, a_prev = (a.double() for a in _alphas(scheduler, t))
    g = torch.Generator().manual_seed(1)
    sample, model_output, noise = torch.randn(3, 2, 4, 3, 3, generator=g, dtype=torch.float64)
    eta = 0.7
    prev, log_prob = ddim_step_with_logprob(model_output, sample, a_t, a_prev, eta, noise=noise)
    # Slow reference: eq. 12 and 16 of arXiv:2010.02502, scalar by scalar.
    at, ap = a_t.item(), a_prev.item()
    sigma = eta * math.sqrt((1 - ap) / (1 - at) * (1 - at / ap))
    x0 = (sample - math.sqrt(1 - at) * model_output) / math.sqrt(at)
    mean = math.sqrt(ap) * x0 + math.sqrt(1 - ap - sigma**2) * model_output
    expected = torch.distributions.Normal(mean, sigma).log_prob(prev).mean(dim=(1, 2, 3))
    torch.testing.assert_close(log_prob, expected, atol=1e-10, rtol=0)
    # the sampled point is mean + sigma * noise, so its log-density is -noise^2/2 - log sigma - log sqrt(2 pi)
    by_noise = (-(noise**2) / 2 - math.log(sigma) - 0.5 * math.log(2 * math.pi)).mean(dim=(1, 2, 3))
    torch.testing.assert_close(log_prob, by_noise, atol=1e-10, rtol=0)


def test_scoring_a_given_sample_and_per_sample_timesteps():
    scheduler = _scheduler()
    g = torch.Generator().manual_seed(2)
    sample, model_output, noise = torch.randn(3, 2, 4, 4, 4, generator=g)
    ts = [int(scheduler.timesteps[i]) for i in (0, 9)]  # first step and the last (final_alpha_cumprod)
    pairs = [_alphas(scheduler, t) for t in ts]
    a_t, a_prev = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
    prev, logp = ddim_step_with_logprob(model_output, sample, a_t, a_prev, 1.0, noise=noise)
    for i, (at, ap) in enumerate(pairs):
        one_prev, one_logp = ddim_step_with_logprob(
            model_output[i : i + 1], sample[i : i + 1], at, ap, 1.0, noise=noise[i : i + 1]
        )
        torch.testing.assert_close(prev[i : i + 1], one_prev, atol=1e-6, rtol=0)
        torch.testing.assert_close(logp[i : i + 1], one_logp, atol=1e-5, rtol=0)
    rescored, relogp = ddim_step_with_logprob(model_output, sample, a_t, a_prev, 1.0, prev_sample=prev)
    assert torch.equal(rescored, prev) and torch.equal(relogp, logp)


def test_eta_zero_is_refused():
    with pytest.raises(ValueError, match="eta=0"):
        ddim_step_with_logprob(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1), 0.5, 0.6, eta=0.0)


def test_gaussian_log_prob_hand_value():
    x = torch.tensor([[1.0, 3.0]])
    value = gaussian_log_prob(x, torch.tensor([[0.0, 1.0]]), 2.0)
    expected = -0.5 * (1 / 8 + 4 / 8) - math.log(2.0) - 0.5 * math.log(2 * math.pi)
    assert value.item() == pytest.approx(expected)


def test_clipped_loss_hand_values():
    adv = torch.tensor([2.0, -1.0, 1.0, -8.0])
    old = torch.zeros(4)
    # ratio 1 everywhere: loss = -mean(clip(A)) with A clipped to +-5
    loss, stats = ddpo_clipped_loss(old.clone(), old, adv, clip_range=0.1, adv_clip_max=5.0)
    assert loss.item() == pytest.approx(-(2 - 1 + 1 - 5) / 4)
    assert stats["approx_kl"].item() == 0 and stats["clipfrac"].item() == 0 and stats["ratio"].item() == 1
    # ratios 1.5, 1.5, 0.5, 0.5 with eps 0.1: max(-A r, -A clip(r))
    logp = torch.tensor([1.5, 1.5, 0.5, 0.5]).log()
    loss, stats = ddpo_clipped_loss(logp, old, adv, clip_range=0.1, adv_clip_max=5.0)
    expected = [max(-2 * 1.5, -2 * 1.1), max(1 * 1.5, 1 * 1.1), max(-1 * 0.5, -1 * 0.9), max(5 * 0.5, 5 * 0.9)]
    assert loss.item() == pytest.approx(sum(expected) / 4)
    assert stats["clipfrac"].item() == 1.0


def test_clipped_loss_gradient_vanishes_where_clipped():
    logp = torch.tensor([0.2, -0.2, 0.2, -0.2], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    loss, _ = ddpo_clipped_loss(logp, torch.zeros(4), adv, clip_range=0.1, adv_clip_max=5.0)
    loss.backward()
    # rows 0, 1: ratio outside the range in the advantage's direction -> clipped -> no gradient
    assert logp.grad[:2].tolist() == [0.0, 0.0]
    assert logp.grad[2].item() == pytest.approx(math.exp(0.2) / 4)
    assert logp.grad[3].item() == pytest.approx(-math.exp(-0.2) / 4)


def test_per_prompt_stats_batch_fallback_then_history():
    tracker = PerPromptStatTracker(buffer_size=4, min_count=3)
    adv = tracker.update(["a", "a", "b"], torch.tensor([1.0, 3.0, 5.0]))
    batch = torch.tensor([1.0, 3.0, 5.0])
    expected = (batch - batch.mean()) / (batch.std(unbiased=False) + 1e-6)  # both below min_count: batch stats
    torch.testing.assert_close(adv, expected)
    adv = tracker.update(["a", "b"], torch.tensor([5.0, 7.0]))
    hist_a = torch.tensor([1.0, 3.0, 5.0], dtype=torch.float64)  # "a" now has 3 >= min_count
    batch = torch.tensor([5.0, 7.0], dtype=torch.float64)  # "b" has 2: this batch's stats
    assert adv[0].item() == pytest.approx(((5 - hist_a.mean()) / (hist_a.std(unbiased=False) + 1e-6)).item())
    assert adv[1].item() == pytest.approx(((7 - batch.mean()) / (batch.std(unbiased=False) + 1e-6)).item())
    tracker.update(["a"] * 3, torch.tensor([0.0, 0.0, 0.0]))
    assert list(tracker.stats["a"]) == [5.0, 0.0, 0.0, 0.0]  # bounded: the last buffer_size rewards
    assert tracker.get_stats() == {"num_prompts": 2, "mean_history": 3.0}


def test_per_prompt_stats_state_dict_round_trip():
    tracker = PerPromptStatTracker(buffer_size=3, min_count=2)
    tracker.update(["x", "y", "x"], torch.tensor([1.0, 2.0, 4.0]))
    state = tracker.state_dict()
    restored = PerPromptStatTracker(buffer_size=1, min_count=1)
    restored.load_state_dict(state)
    rewards = torch.tensor([3.0, 0.5])
    torch.testing.assert_close(restored.update(["x", "y"], rewards), tracker.update(["x", "y"], rewards))
    assert restored.state_dict() == tracker.state_dict()
    with pytest.raises(ValueError, match="one reward per prompt"):
        tracker.update(["x"], torch.tensor([1.0, 2.0]))


def test_batch_advantages():
    adv = batch_advantages(torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0.0, 1.0]) / math.sqrt(2 / 3), atol=1e-6, rtol=0)
