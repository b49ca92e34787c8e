"""A model passed already wrapped as a PeftModel (a pretrained adapter): its reference is the adapter as given (a
frozen "ref" copy, as TRL 1.16), not the base model. The adapters here are not zero-initialised, so the base model
differs from the policy and every test below fails if the reference were the base model."""

import math

import pytest
import torch

from replayrl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, KTOConfig, KTOTrainer, RLOOConfig, RLOOTrainer
from replayrl.generation.base import hf_state_dict
from replayrl.models.peft_reference import add_reference_adapter, reference_adapter
from replayrl.models.tiny import build_tiny_model
from replayrl.tasks.preferences import preference_datasets
from tests.conftest import QUIET_CPU_RUN, full_and_resumed_logs, loss_logs, tiny_args

peft = pytest.importorskip("peft")

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
EXACT = dict(bf16=False, gradient_checkpointing=False)


def pretrained_adapter(tokenizer, adapter_name="default", **config):
    """A tiny model with a LoRA adapter whose update is not zero (`init_lora_weights=False`), seeded."""
    torch.manual_seed(0)
    settings = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
                    task_type="CAUSAL_LM")  # fmt: skip
    settings.update(config)
    model = build_tiny_model(tokenizer, seed=0, **SMALL)
    return peft.get_peft_model(model, peft.LoraConfig(**settings), adapter_name=adapter_name)


def adapter_params(model, name):
    return {n: p.detach().clone() for n, p in model.named_parameters() if f".{name}." in n}


def sample(tokenizer):
    return tokenizer(["2+2=4", "3+5=8 and more"], return_tensors="pt", padding=True)


def logits(model, batch):
    with torch.no_grad():
        return model(**batch).logits


@pytest.fixture(scope="module")
def pairs():
    return preference_datasets(seed=0, per_problem=1, rejected="near_miss")[0].select(range(16))


def dpo(model, tokenizer, pairs, tmp_path, **overrides):
    kwargs = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_steps=2, learning_rate=5e-2,
                  **QUIET_CPU_RUN)  # fmt: skip
    args = DPOConfig(**{**kwargs, **overrides})
    return DPOTrainer(model, args=args, train_dataset=pairs, processing_class=tokenizer)


def test_reference_adapter_restores_the_trained_adapter_and_requires_grad(tokenizer):
    model = pretrained_adapter(tokenizer)
    frozen = next(p for n, p in model.named_parameters() if "lora_A.default" in n)
    frozen.requires_grad_(False)  # a user's choice that PEFT's set_adapter would undo
    add_reference_adapter(model)
    assert "ref" in model.peft_config and model.active_adapter == "default"
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    assert not any(flag for n, flag in before.items() if ".ref." in n)
    batch = sample(tokenizer)
    policy = logits(model, batch)
    with reference_adapter(model):
        assert model.active_adapter == "ref"
        assert logits(model, batch).equal(policy)  # the copy computes the policy as given
    assert model.active_adapter == "default"
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before
    model.delete_adapter("ref")  # as with a peft_config: the reference is the base model, which differs
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    with reference_adapter(model):
        assert not torch.allclose(logits(model, batch), policy, atol=1e-4)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before


def test_dpo_reference_is_the_passed_adapter(tokenizer, pairs, tmp_path):
    model = pretrained_adapter(tokenizer, lora_dropout=0.5).eval()  # disable_dropout turns the copy's off too
    batch = sample(tokenizer)
    given = logits(model, batch)
    trainer = dpo(model, tokenizer, pairs, tmp_path, max_steps=3, save_strategy="steps", save_steps=3)
    assert trainer.ref_model is None and "ref" in trainer.model.peft_config
    ref_before = adapter_params(trainer.model, "ref")
    trainer.train()
    first = trainer.state.log_history[0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert first["rewards/chosen"] == 0 and first["rewards/rejected"] == 0
    trained = trainer.accelerator.unwrap_model(trainer.model)
    assert all(torch.equal(ref_before[n], p) for n, p in adapter_params(trained, "ref").items())
    assert not any(p.requires_grad for n, p in trained.named_parameters() if ".ref." in n)
    assert all(p.requires_grad for n, p in trained.named_parameters() if ".default." in n)
    optimized = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    names = {n for n, p in trained.named_parameters() if id(p) in optimized}
    assert names and all(".default." in n for n in names)
    with reference_adapter(trained):
        assert torch.allclose(logits(trained, batch), given, atol=1e-6)
    assert not torch.allclose(logits(trained, batch), given, atol=1e-4)  # the policy trained
    # The checkpoint and the final model hold the trained adapter at the top (and, as TRL's, the copy in ref/)
    checkpoint = tmp_path / "out" / "checkpoint-3"
    assert (checkpoint / "adapter_model.safetensors").exists() and (checkpoint / "ref").is_dir()


def test_dpo_resume_rebuilds_the_same_reference(tokenizer, pairs, tmp_path):
    def run(out, stop=False, resume=None):
        trainer = dpo(pretrained_adapter(tokenizer), tokenizer, pairs, out, output_dir=str(out), max_steps=4,
                      per_device_train_batch_size=4, save_strategy="steps", save_steps=1)  # fmt: skip
        return loss_logs(trainer, stop=stop, resume=resume)

    for full, resumed in full_and_resumed_logs(run, tmp_path):
        assert resumed["loss"] == pytest.approx(full["loss"], abs=1e-6)
        assert resumed["rewards/margins"] == pytest.approx(full["rewards/margins"], abs=1e-6)


def test_dpo_with_a_peft_config_keeps_the_base_model_as_reference(tokenizer, pairs, tmp_path):
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = DPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=8, **QUIET_CPU_RUN)
    trainer = DPOTrainer(build_tiny_model(tokenizer, seed=0, **SMALL), args=args, train_dataset=pairs,
                         processing_class=tokenizer, peft_config=config)  # fmt: skip
    assert list(trainer.model.peft_config) == ["default"]


def test_an_adapter_not_named_default_is_copied(tokenizer, pairs, tmp_path):
    trainer = dpo(pretrained_adapter(tokenizer, adapter_name="sft"), tokenizer, pairs, tmp_path, max_steps=1)
    assert set(trainer.model.peft_config) == {"sft", "ref"}
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)


def test_an_existing_ref_adapter_is_refused(tokenizer, pairs, tmp_path):
    model = pretrained_adapter(tokenizer)
    model.add_adapter("ref", model.peft_config["default"])
    with pytest.raises(ValueError, match="already has an adapter named 'ref'"):
        dpo(model, tokenizer, pairs, tmp_path)


def test_prompt_tuning_adapter_is_copied(tokenizer, pairs, tmp_path):
    torch.manual_seed(0)
    config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    model = peft.get_peft_model(build_tiny_model(tokenizer, seed=0, **SMALL), config)
    trainer = dpo(model, tokenizer, pairs, tmp_path, max_steps=2)
    ref_before = adapter_params(trainer.model, "ref")
    assert ref_before
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert all(torch.equal(ref_before[n], p) for n, p in adapter_params(trainer.model, "ref").items())


def test_kto_reference_is_the_passed_adapter(tokenizer, tmp_path):
    data = preference_datasets(0, per_problem=1)[0]
    args = KTOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_steps=2,
                     learning_rate=5e-2, **QUIET_CPU_RUN, **EXACT)  # fmt: skip
    model = pretrained_adapter(tokenizer, lora_dropout=0.5)  # disable_dropout turns the copy's off too
    trainer = KTOTrainer(model, args=args, train_dataset=data, processing_class=tokenizer)
    assert "ref" in trainer.model.peft_config
    ref_before = adapter_params(trainer.model, "ref")
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs[0]["rewards/chosen"] == 0 and logs[0]["rewards/rejected"] == 0  # policy == reference at step 0
    assert logs[1]["rewards/margins"] != 0
    assert all(torch.equal(ref_before[n], p) for n, p in adapter_params(trainer.model, "ref").items())


@pytest.mark.parametrize("cls, config", [(GRPOTrainer, GRPOConfig), (RLOOTrainer, RLOOConfig)])
def test_grpo_and_rloo_kl_is_zero_at_the_first_step(tokenizer, dataset, tmp_path, cls, config):
    model = pretrained_adapter(tokenizer, lora_dropout=0.5)  # dropout off in the copy too (disable_dropout)
    args = tiny_args(config, tmp_path, beta=0.1, max_steps=3, learning_rate=5e-2, disable_dropout=True)
    trainer = cls(model=model, reward_funcs=lambda completions, **kw: [float(len(c) % 3) for c in completions],
                  args=args, train_dataset=dataset, processing_class=tokenizer)  # fmt: skip
    assert trainer.ref_model is None and "ref" in trainer.model.peft_config
    ref_before = adapter_params(trainer.model, "ref")
    trainer.train()
    kls = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    assert kls[0] == pytest.approx(0.0, abs=1e-7)  # the base model would give a KL well above that
    assert kls[-1] != 0  # RLOO logs the mean log-ratio, which may be negative
    assert all(torch.equal(ref_before[n], p) for n, p in adapter_params(trainer.model, "ref").items())


def test_grpo_without_kl_adds_no_reference_adapter_but_rloo_does(tokenizer, dataset, tmp_path):
    reward = lambda completions, **kw: [0.0] * len(completions)  # noqa: E731
    cases = [(GRPOTrainer, GRPOConfig, ["default"]), (RLOOTrainer, RLOOConfig, ["default", "ref"])]
    for cls, config, expected in cases:
        args = tiny_args(config, tmp_path, beta=0.0)
        trainer = cls(model=pretrained_adapter(tokenizer), reward_funcs=reward, args=args, train_dataset=dataset,
                      processing_class=tokenizer)  # fmt: skip
        assert list(trainer.model.peft_config) == expected, cls


def test_weight_sync_sends_the_trained_adapter_only(tokenizer):
    """vLLM receives the active adapter merged, never the frozen copy's `modules_to_save`."""
    model = pretrained_adapter(tokenizer, modules_to_save=["embed_tokens"])
    add_reference_adapter(model)
    trained = next(p for n, p in model.named_parameters() if "modules_to_save.default" in n)
    with torch.no_grad():
        trained.add_(1.0)
    sent = dict(hf_state_dict(model))
    assert torch.equal(sent["model.embed_tokens.weight"], trained)
    assert not any("ref" in name.split(".") for name in sent)
