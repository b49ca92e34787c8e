"""Trainer/engine mismatch correction: hand-computed values for every mode."""

import math

import pytest
import torch

from replayrl.algos import engine_is_weights, logp_difference

NAN = float("nan")


def _inputs():
    # row 0: log-ratios ln2, ln(1/2), padding; row 1: log-ratios ln4, 0, (engine NaN -> ignored)
    trainer = torch.tensor([[math.log(0.4), math.log(0.1), 0.0], [math.log(0.8), math.log(0.5), math.log(0.3)]])
    engine = torch.tensor([[math.log(0.2), math.log(0.2), 7.0], [math.log(0.2), math.log(0.5), NAN]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return trainer, engine, mask


def test_token_truncate():
    w = engine_is_weights(*_inputs(), mode="token_truncate", cap=3.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 1.0], [3.0, 1.0, 1.0]]))


def test_token_mask():
    w = engine_is_weights(*_inputs(), mode="token_mask", cap=3.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 1.0], [0.0, 1.0, 1.0]]))


def test_sequence_modes():
    # row 0: 2 * 0.5 = 1; row 1: 4 * 1 = 4 -> truncated to 3 or masked to 0
    trunc = engine_is_weights(*_inputs(), mode="sequence_truncate", cap=3.0)
    torch.testing.assert_close(trunc, torch.tensor([[1.0], [3.0]]))
    masked = engine_is_weights(*_inputs(), mode="sequence_mask", cap=3.0)
    torch.testing.assert_close(masked, torch.tensor([[1.0], [0.0]]))
    assert torch.isfinite(masked).all()


def test_weights_are_detached_and_loop_reference():
    trainer, engine, mask = _inputs()
    trainer = trainer.clone().requires_grad_()
    w = engine_is_weights(trainer, engine, mask, mode="token_truncate", cap=2.5)
    assert not w.requires_grad
    for b in range(2):
        for t in range(3):
            real = mask[b, t] == 1 and not math.isnan(engine[b, t])
            expected = min(math.exp(trainer[b, t].item() - engine[b, t].item()), 2.5) if real else 1.0
            assert w[b, t].item() == pytest.approx(expected, rel=1e-6)


def test_logp_difference_and_bad_mode():
    diff = logp_difference(*_inputs())
    torch.testing.assert_close(diff, torch.tensor([math.log(2), math.log(2), math.log(4), 0.0]))
    with pytest.raises(ValueError, match="token_truncate"):
        engine_is_weights(*_inputs(), mode="tis", cap=2.0)


def test_lower_bound_truncates_or_masks_small_ratios():
    trainer = torch.log(torch.tensor([[0.2, 0.9, 0.5]]))
    engine = torch.log(torch.tensor([[0.8, 0.3, 0.5]]))  # ratios 0.25, 3.0, 1.0
    mask = torch.ones(1, 3)
    truncated = engine_is_weights(trainer, engine, mask, mode="token_truncate", cap=2.0, clip_min=0.5)
    torch.testing.assert_close(truncated, torch.tensor([[0.5, 2.0, 1.0]]))
    masked = engine_is_weights(trainer, engine, mask, mode="token_mask", cap=None, clip_min=0.5)
    torch.testing.assert_close(masked, torch.tensor([[0.0, 3.0, 1.0]]))


def test_trl_bound_names_and_the_deprecated_cap(tmp_path):
    from replayrl import GRPOConfig

    args = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, report_to="none")
    assert GRPOConfig(**args, vllm_importance_sampling_cap=5.0).vllm_importance_sampling_clip_max == 5.0
    with pytest.raises(ValueError, match="clip_min must be >= 0 and below clip_max"):
        GRPOConfig(**args, vllm_importance_sampling_clip_min=4.0)
