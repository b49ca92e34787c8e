"""TRL 1.16's GRPOConfig fields and defaults, checked against the live record (`tests/trl_fields/grpo.json`), and
the defaults taken from TRL 1.16 (where the seed, TRL 0.16's docs, is silent) checked through `train()`."""

import copy

import pytest
import torch

from replayrl import GRPOConfig, GRPOTrainer, GRPOWithReplayBufferConfig
from tests.conftest import tiny_args, tiny_moe_model
from tests.grpo.test_parity_losses import Spy, varied_reward
from tests.trl_fields.parity import mismatches

SEED = "seed grpo_trainer.md (TRL 0.16's GRPOConfig signature); docs/deviations.md, defaults"
# TRL 1.16 defaults replayrl keeps different on purpose, with where that is documented.
DELIBERATE = {
    "beta": f"{SEED}: 0.04 (TRL 1.16: 0.0)",
    "temperature": f"{SEED}: 0.9 (TRL 1.16: 1.0)",
    "top_k": f"{SEED}: 50 (TRL 1.16: 0)",
    "max_completion_length": f"{SEED}: 256 (TRL 1.16: 512)",
    "vllm_server_timeout": f"{SEED}: 120 (TRL 1.16: 240)",
    "bf16": "seed's False; docs/deviations.md (Loading): a CPU-first run trains in fp32 (TRL 1.16: None, bf16 on)",
    "gradient_checkpointing": "seed's False; docs/deviations.md (Loading): transformers' default kept (TRL: True)",
}


@pytest.mark.parametrize("config_cls", [GRPOConfig, GRPOWithReplayBufferConfig])
def test_every_trl_field_with_trl_defaults(config_cls):
    """TRL 1.16 has no GRPOWithReplayBufferConfig (its replay-buffer trainer left trl.experimental); replayrl's
    extends GRPOConfig, so it is held to TRL's GRPOConfig fields as well."""
    assert mismatches(config_cls, "grpo", DELIBERATE) == []


def test_trl_1_16_defaults_where_the_seed_is_silent():
    args = GRPOConfig(output_dir="x")
    assert args.use_bias_correction_kl is True
    assert args.router_aux_loss_coef is None and args.num_completions_to_print is None
    assert args.pad_to_multiple_of is None  # "auto": 128 on Neuron only
    assert GRPOConfig(output_dir="x", pad_to_multiple_of="16").pad_to_multiple_of == 16  # from the CLI
    with pytest.raises(ValueError, match="pad_to_multiple_of=0"):
        GRPOConfig(output_dir="x", pad_to_multiple_of=0)


def test_pad_to_multiple_of_auto_trains_unpadded_and_a_string_pads(model, tokenizer, dataset, tmp_path):
    widths = {}
    for value in ("auto", "16"):
        args = tiny_args(GRPOConfig, tmp_path / value, max_steps=1, pad_to_multiple_of=value)
        trainer = Spy(model=copy.deepcopy(model), reward_funcs=varied_reward, args=args, train_dataset=dataset,
                      processing_class=tokenizer)  # fmt: skip
        trainer.train()
        batch = trainer._micro_batches[0]
        widths[value] = (batch.prompt_ids.shape[1], batch.completion_ids.shape[1])
    assert widths["16"] == (16, 16)
    assert widths["auto"][0] % 16 != 0 and widths["auto"][1] <= 6  # no padding: the natural widths


def test_bias_corrected_kl_is_the_default_loss(model, tokenizer, dataset, tmp_path):
    """Step 2 re-trains step 1's rows (num_iterations=2) after an update, so the ratio is off 1: the default's KL
    term is the k3 estimate times the importance ratio (TRL 1.16's `use_bias_correction_kl=True`)."""
    runs = {}
    for name, extra in (("default", {}), ("plain", {"use_bias_correction_kl": False})):
        args = tiny_args(GRPOConfig, tmp_path / name, num_iterations=2, beta=0.1, learning_rate=0.1,
                         per_device_train_batch_size=8, **extra)  # fmt: skip
        trainer = Spy(model=copy.deepcopy(model), reward_funcs=varied_reward, args=args, train_dataset=dataset,
                      processing_class=tokenizer)  # fmt: skip
        trainer.train()
        runs[name] = trainer
    first = [runs[name].state.log_history[0]["loss"] for name in runs]
    assert first[0] == pytest.approx(first[1], abs=1e-7)  # on-policy from the reference: the same first step
    corrected, plain = runs["default"].objectives[1], runs["plain"].objectives[1]
    mask = corrected.token_mask
    ratio = corrected.terms.ratio.detach()
    assert not torch.allclose(ratio[mask], torch.ones_like(ratio[mask]))
    torch.testing.assert_close(corrected.kl.detach()[mask], (plain.kl.detach() * ratio)[mask], rtol=1e-5, atol=1e-7)
    assert runs["default"].state.log_history[1]["kl"] != pytest.approx(runs["plain"].state.log_history[1]["kl"])


def test_router_aux_loss_coef_none_takes_the_models_coefficient(tokenizer, dataset, tmp_path):
    """As TRL 1.16: a MoE model trains with its own coefficient, router logits asked for whatever its config says."""
    moe = tiny_moe_model(tokenizer, bos_token_id=tokenizer.eos_token_id, router_aux_loss_coef=0.02,
                         output_router_logits=False)  # fmt: skip
    trainer = GRPOTrainer(model=moe, reward_funcs=varied_reward, args=tiny_args(GRPOConfig, tmp_path, max_steps=1),
                          train_dataset=dataset, processing_class=tokenizer)  # fmt: skip
    assert trainer.aux_loss_enabled and trainer.router_aux_loss_coef == 0.02
    trainer.train()
    assert trainer.state.log_history[0]["aux_loss"] > 0


def test_router_aux_loss_coef_on_a_dense_model(model, tokenizer, dataset, tmp_path):
    trainer = GRPOTrainer(model=model, reward_funcs=varied_reward, args=tiny_args(GRPOConfig, tmp_path),
                          train_dataset=dataset, processing_class=tokenizer)  # fmt: skip
    assert not trainer.aux_loss_enabled and trainer.router_aux_loss_coef == 0.0
    with pytest.raises(ValueError, match="router_aux_loss_coef=0.5 but .* not a Mixture-of-Experts"):
        GRPOTrainer(model=model, reward_funcs=varied_reward, args=tiny_args(GRPOConfig, tmp_path / "b",
                    router_aux_loss_coef=0.5), train_dataset=dataset, processing_class=tokenizer)  # fmt: skip


def test_num_completions_to_print_none_prints_every_completion(model, tokenizer, dataset, tmp_path, capsys):
    args = tiny_args(GRPOConfig, tmp_path, max_steps=1, per_device_train_batch_size=12, log_completions=True)
    GRPOTrainer(model=model, reward_funcs=varied_reward, args=args, train_dataset=dataset,
                processing_class=tokenizer).train()  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("prompt "))
    rows = 0
    while header + 1 + rows < len(lines) and lines[header + 1 + rows][:1] in ("'", '"'):
        rows += 1  # a row starts with the repr of its prompt
    assert rows == 12  # every completion of the step, not replayrl's former first 8
