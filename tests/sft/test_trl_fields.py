"""TRL 1.16's SFTConfig fields that replayrl's SFT gained late: each one checked through `train()`."""

import warnings

import pytest
import torch

from replayrl import SFTConfig, SFTTrainer
from replayrl.models.tiny import build_tiny_model, build_tokenizer
from tests.sft.helpers import addition_dataset, record, sft_args
from tests.trl_fields.parity import mismatches
from tests.trl_fields.probes import offloading_seen, save_remote_code_model

# TRL 1.16 defaults replayrl keeps different on purpose, with where that is documented.
DELIBERATE = {
    "bf16": "docs/sft.md and docs/deviations.md (Loading): transformers' False, so a CPU-first run trains in fp32",
    "gradient_checkpointing": "docs/sft.md: transformers' default kept (CPU-first, tiny models)",
}


def test_every_trl_field_with_trl_defaults():
    assert mismatches(SFTConfig, "sft", DELIBERATE) == []


def one_step(tmp_path, name, data=None, **overrides):
    """(loss, parameters after one SGD step, the batches trained on)."""
    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    args = sft_args(tmp_path / name, max_steps=1, optim="sgd", learning_rate=0.5, **overrides)
    trainer = SFTTrainer(model, args=args, train_dataset=data or addition_dataset(12), processing_class=tok)
    recorder = record(trainer)
    trainer.train()
    loss = next(h["loss"] for h in trainer.state.log_history if "loss" in h)
    return loss, torch.cat([p.detach().flatten() for p in trainer.model.parameters()]), recorder.batches


def test_pad_to_multiple_of_pads_the_trained_batch_and_keeps_the_loss(tmp_path):
    loss_a, params_a, batches_a = one_step(tmp_path, "plain", per_device_train_batch_size=12)
    loss_b, params_b, batches_b = one_step(tmp_path, "padded", per_device_train_batch_size=12, pad_to_multiple_of=8)
    width_a, width_b = batches_a[0]["input_ids"].shape[1], batches_b[0]["input_ids"].shape[1]
    assert width_a % 8 != 0 and width_b % 8 == 0 and width_b > width_a
    assert loss_a == pytest.approx(loss_b, abs=1e-6)
    assert torch.allclose(params_a, params_b, atol=1e-6)


def test_pad_to_multiple_of_auto_and_cli_strings():
    assert SFTConfig(output_dir="x").pad_to_multiple_of is None  # "auto": 128 on Neuron only
    assert SFTConfig(output_dir="x", pad_to_multiple_of="16").pad_to_multiple_of == 16
    with pytest.raises(ValueError, match="pad_to_multiple_of=0"):
        SFTConfig(output_dir="x", pad_to_multiple_of=0)


@pytest.mark.parametrize("setting", [{}, {"packing": True, "max_length": 32}])
def test_activation_offloading_gives_the_same_step(tmp_path, setting):
    loss_a, params_a, _ = one_step(tmp_path, "on-device", per_device_train_batch_size=12, **setting)
    loss_b, params_b, _ = one_step(
        tmp_path, "offloaded", per_device_train_batch_size=12, activation_offloading=True, **setting
    )
    assert loss_a == pytest.approx(loss_b, abs=1e-6)
    assert torch.allclose(params_a, params_b, atol=1e-6)


@pytest.mark.parametrize("offload", [False, True])
def test_activation_offloading_wraps_the_training_forward(tmp_path, offload):
    tok = build_tokenizer()
    args = sft_args(tmp_path, max_steps=1, activation_offloading=offload)
    trainer = SFTTrainer(build_tiny_model(tok), args=args, train_dataset=addition_dataset(8), processing_class=tok)
    seen = offloading_seen(trainer)
    trainer.train()
    assert seen == [offload]


def test_shuffle_dataset_shuffles_the_prepared_rows_by_seed(tmp_path):
    tok = build_tokenizer()

    def rows(name, **overrides):
        args = sft_args(tmp_path / name, **overrides)
        trainer = SFTTrainer(build_tiny_model(tok), args=args, train_dataset=addition_dataset(), processing_class=tok)
        return [tuple(ids) for ids in trainer.train_dataset["input_ids"]]

    plain, shuffled = rows("plain"), rows("shuffled", shuffle_dataset=True)
    assert shuffled != plain and sorted(shuffled) == sorted(plain)
    assert rows("again", shuffle_dataset=True) == shuffled
    assert rows("seed1", shuffle_dataset=True, seed=1) != shuffled


def test_trust_remote_code_reaches_model_and_tokenizer_loading(tmp_path):
    path = save_remote_code_model(tmp_path / "remote")
    args = sft_args(tmp_path, max_steps=1, trust_remote_code=True)
    trainer = SFTTrainer(path, args=args, train_dataset=addition_dataset(8))
    assert type(trainer.model).__name__ == "RemoteForCausalLM"  # the checkpoint's own class: its code ran
    trainer.train()
    with pytest.raises(ValueError, match="custom code"):
        SFTTrainer(path, args=sft_args(tmp_path / "untrusted"), train_dataset=addition_dataset(8))


def test_pad_token_is_applied_with_trls_deprecation_warning(tmp_path):
    tok = build_tokenizer()
    with pytest.warns(FutureWarning, match="`pad_token` is deprecated"):
        args = sft_args(tmp_path, pad_token="<|im_end|>")
    trainer = SFTTrainer(build_tiny_model(tok), args=args, train_dataset=addition_dataset(8), processing_class=tok)
    assert trainer.processing_class.pad_token == "<|im_end|>"
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="pad_token='<nope>' is not in the tokenizer"):
        args = sft_args(tmp_path, pad_token="<nope>")
        SFTTrainer(build_tiny_model(tok), args=args, train_dataset=addition_dataset(8), processing_class=tok)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        sft_args(tmp_path)


def test_eos_token_is_mirrored_onto_the_model_as_trl(tmp_path):
    """TRL 1.16: `eos_token` becomes the tokenizer's EOS, the model config's `eos_token_id`, and the first of the
    generation config's EOS ids (the old ones still stop generation); the documents end with it."""
    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    old_id, new_id = tok.eos_token_id, tok.convert_tokens_to_ids("|")
    args = sft_args(tmp_path / "eos", max_steps=1, eos_token="|")
    trainer = SFTTrainer(model, args=args, train_dataset=addition_dataset(12), processing_class=tok)
    assert tok.eos_token == "|" and model.config.eos_token_id == new_id
    assert model.generation_config.eos_token_id == [new_id, old_id]
    assert all(row["input_ids"][-1] == new_id for row in trainer.train_dataset)
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        SFTTrainer(model, args=sft_args(tmp_path / "bad", max_steps=1, eos_token="<nope>"), processing_class=tok,
                   train_dataset=addition_dataset(12))  # fmt: skip


def test_lora_init_follows_the_config_seed(tmp_path):
    """As TRL 1.16 (`set_seed(args.seed)` before the model and adapter are built): the LoRA weights a trainer
    starts from depend on `seed` alone, not on the global RNG state before construction."""
    peft = pytest.importorskip("peft")

    def lora_a(seed, noise):
        tok = build_tokenizer()
        model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
        torch.manual_seed(noise)  # whatever ran before
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        args = sft_args(tmp_path / f"s{seed}-{noise}", max_steps=1, seed=seed)
        trainer = SFTTrainer(model, args=args, train_dataset=addition_dataset(4), processing_class=tok,
                             peft_config=config)  # fmt: skip
        return torch.cat([p.detach().flatten() for n, p in trainer.model.named_parameters() if "lora_A" in n])

    assert torch.equal(lora_a(0, noise=1), lora_a(0, noise=2))
    assert not torch.equal(lora_a(0, noise=1), lora_a(1, noise=1))
