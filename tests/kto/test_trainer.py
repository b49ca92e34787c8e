"""KTOTrainer end to end on a tiny local Qwen2: learning, what it trained on, TRL's fields, invariances."""

import pytest
import torch
from datasets import Dataset

from replayrl import KTOConfig, KTOTrainer
from replayrl.algos.kto import kto_losses
from replayrl.kto.trainer import completion_logps
from replayrl.models.tiny import build_tiny_model
from replayrl.tasks.preferences import preference_datasets
from tests.conftest import assert_accumulation_invariant, full_and_resumed_logs, loss_logs
from tests.trl_fields.parity import mismatches

EXACT = dict(bf16=False, gradient_checkpointing=False)  # TRL's defaults turn both on; exactness tests want fp32


def kto_args(tmp_path, **overrides):
    kwargs = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_steps=2, learning_rate=1e-2,
                  logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
                  **EXACT)  # fmt: skip
    return KTOConfig(**{**kwargs, **overrides})


def make(tokenizer, tmp_path, dataset=None, **overrides):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    dataset = preference_datasets(0, per_problem=1)[0] if dataset is None else dataset
    return KTOTrainer(model, args=kto_args(tmp_path, **overrides), train_dataset=dataset, processing_class=tokenizer)


def test_every_trl_field_with_trl_defaults():
    assert mismatches(KTOConfig, "kto") == []


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"precompute_ref_log_probs": True}, "precompute_ref_log_probs=True is not implemented"),
        ({"router_aux_loss_coef": 0.01}, "router_aux_loss_coef"),
        ({"loss_type": "bco"}, "loss_type must be one of"),
    ],
)
def test_options_that_cannot_apply_are_refused_with_the_fix(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        kto_args(tmp_path, **overrides)


def test_activation_offloading_gives_the_same_steps(tokenizer, tmp_path):
    """save_on_cpu around the training forward (replayrl.accumulation): the same losses and weights."""
    runs = []
    for offload in (False, True):
        trainer = make(tokenizer, tmp_path / str(offload), activation_offloading=offload)
        losses = [h["loss"] for h in loss_logs(trainer)]
        runs.append((losses, [p.detach().clone() for p in trainer.model.parameters()]))
    assert runs[1][0] == pytest.approx(runs[0][0], abs=1e-6)
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)


def test_one_row_per_step_is_refused(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="at least 2 rows per optimizer step"):
        make(tokenizer, tmp_path, per_device_train_batch_size=1)


def test_learns_unpaired_labels_through_train(tokenizer, tmp_path):
    """Unpaired rows (prompt, completion, label) straight from the user: desirable completions gain log-prob,
    undesirable ones lose it, on held-out prompts too."""
    pairs, held_out = preference_datasets(0, per_problem=2)
    unpaired = Dataset.from_dict({
        "prompt": list(pairs["prompt"]) * 2, "completion": list(pairs["chosen"]) + list(pairs["rejected"]),
        "label": [True] * len(pairs) + [False] * len(pairs),
    }).shuffle(seed=0)  # fmt: skip
    trainer = make(tokenizer, tmp_path, dataset=unpaired, max_steps=30, logging_steps=5, learning_rate=3e-2)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rewards/margins" in h]
    assert logs[0]["rewards/margins"] < 0.5 < logs[-1]["rewards/margins"], logs
    metrics = trainer.evaluate(held_out)
    assert metrics["eval_rewards/margins"] > 0.5, metrics


def test_trains_on_the_kto_loss_with_the_step_reference_point(tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path, max_steps=1, beta=0.3, desirable_weight=1.5, undesirable_weight=0.7)
    seen, original = [], trainer.compute_loss

    def spy(model, inputs, *args, **kwargs):
        seen.append({k: v.clone() if torch.is_tensor(v) else v for k, v in inputs.items()})
        return original(model, inputs, *args, **kwargs)

    trainer.compute_loss = spy
    policy = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    (batch,) = seen
    fresh = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    fresh.load_state_dict(policy)
    with torch.no_grad():
        ratios = completion_logps(fresh, batch)[0] - completion_logps(trainer.ref_model, batch)[0]
    assert ratios.abs().max() < 1e-5  # step 1: policy == reference
    expected = kto_losses(ratios, batch["label"], batch["kto_reference_point"], 0.3, 1.5, 0.7).mean()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected.item(), rel=1e-4)
    assert trainer.state.log_history[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # KL(pi || pi) = 0


def test_gradient_accumulation_1x8_equals_8x1(tokenizer, tmp_path):
    make_in = lambda out, **kw: make(tokenizer, out, **kw)  # noqa: E731
    log8, log1 = assert_accumulation_invariant(make_in, tmp_path, steps=2)
    # the second step's reference point is KL(pi_1 || pi_ref) > 0, estimated over the whole step either way
    assert log1[1]["kl"] == pytest.approx(log8[1]["kl"], rel=1e-4) and log8[1]["kl"] > 0


def test_exact_resume(tokenizer, tmp_path):
    def run(out, stop=False, resume=None):
        trainer = make(tokenizer, tmp_path, output_dir=str(out), per_device_train_batch_size=4, max_steps=4,
                       save_strategy="steps", save_steps=1, sync_ref_model=True, ref_model_sync_steps=2)  # fmt: skip
        return loss_logs(trainer, stop, resume)

    for x, y in full_and_resumed_logs(run, tmp_path):
        for k in ("loss", "grad_norm", "kl", "rewards/margins"):
            assert y[k] == pytest.approx(x[k], rel=1e-4, abs=1e-6), (x["step"], k)


def test_trl_defaults_train(tokenizer, tmp_path):
    """TRL's defaults as they are (bf16 autocast, gradient checkpointing, sequential sampling) run on CPU."""
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = KTOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, report_to="none",
                     use_cpu=True, save_strategy="no")  # fmt: skip
    assert args.bf16 and args.gradient_checkpointing and args.train_sampling_strategy == "sequential"
    KTOTrainer(model, args=args, train_dataset=preference_datasets(0, 1)[0], processing_class=tokenizer).train()
