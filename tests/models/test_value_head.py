"""AutoModelForCausalLMWithValueHead: forward, exact save/load round trip, plain-LM compatibility, reference
models (shared layers), PEFT."""

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from replayrl.models.tiny import build_tiny_model
from replayrl.models.value_head import AutoModelForCausalLMWithValueHead, create_reference_model

IDS = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]])


def tiny(tokenizer, **kwargs):
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, **kwargs)


@pytest.fixture
def vmodel(tokenizer):
    return AutoModelForCausalLMWithValueHead.from_pretrained(tiny(tokenizer), v_head_init_strategy="normal").eval()


def test_forward_returns_logits_loss_value(vmodel, tokenizer):
    logits, loss, value = vmodel(IDS)
    assert logits.shape == (2, 5, len(tokenizer)) and logits.dtype == torch.float32
    assert loss is None and value.shape == (2, 5)
    _, loss, _ = vmodel(IDS, labels=IDS)
    assert loss is not None and loss.item() > 0
    # the value is the head applied to the LM's last hidden state
    hidden = vmodel.pretrained_model(IDS, output_hidden_states=True).hidden_states[-1]
    torch.testing.assert_close(value, vmodel.v_head.summary(hidden).squeeze(-1))


def test_head_kwargs(tokenizer):
    model = AutoModelForCausalLMWithValueHead.from_pretrained(
        tiny(tokenizer), summary_dropout_prob=0.3, v_head_init_strategy="normal", v_head_initializer_range=0.01
    )
    assert model.v_head.dropout.p == 0.3
    assert (model.v_head.summary.bias == 0).all() and model.v_head.summary.weight.std() < 0.05
    with pytest.raises(ValueError, match="v_head_init_strategy"):
        AutoModelForCausalLMWithValueHead.from_pretrained(tiny(tokenizer), v_head_init_strategy="xavier")


def test_save_load_round_trip_is_exact(vmodel, tmp_path):
    vmodel.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert {"v_head.summary.weight", "v_head.summary.bias"} <= keys
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(str(tmp_path)).eval()
    for a, b in zip(vmodel(IDS), loaded(IDS)):
        if a is not None:
            assert torch.equal(a, b)
    assert torch.equal(loaded.v_head.summary.weight, vmodel.v_head.summary.weight)
    # a plain causal LM loads the same folder, ignoring the head
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert torch.equal(plain(IDS).logits, vmodel(IDS)[0])


def test_generate_delegates(vmodel, tokenizer):
    out = vmodel.generate(input_ids=IDS[:1], attention_mask=torch.ones_like(IDS[:1]), max_new_tokens=3, do_sample=False)
    ref = vmodel.pretrained_model.generate(
        input_ids=IDS[:1], attention_mask=torch.ones_like(IDS[:1]), max_new_tokens=3, do_sample=False
    )
    assert torch.equal(out, ref) and out.shape == (1, 8)


def test_reference_model_is_a_frozen_copy(vmodel):
    ref = create_reference_model(vmodel)
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    assert all(p.requires_grad for p in vmodel.parameters())
    assert torch.equal(ref(IDS)[0], vmodel(IDS)[0])
    with torch.no_grad():
        vmodel.pretrained_model.model.layers[0].mlp.up_proj.weight.add_(1.0)
    assert not torch.equal(ref(IDS)[0], vmodel(IDS)[0])


def test_reference_model_shares_layers(vmodel):
    ref = create_reference_model(vmodel, num_shared_layers=1)
    layers, ref_layers = vmodel.pretrained_model.model.layers, ref.pretrained_model.model.layers
    assert layers[0].mlp.up_proj.weight is ref_layers[0].mlp.up_proj.weight
    assert layers[1].mlp.up_proj.weight is not ref_layers[1].mlp.up_proj.weight
    # shared tensors are frozen in the policy too (as TRL v0.7.1); the rest of the policy still trains
    assert not layers[0].mlp.up_proj.weight.requires_grad and layers[1].mlp.up_proj.weight.requires_grad
    assert vmodel.v_head.summary.weight.requires_grad
    assert torch.equal(ref(IDS)[0], vmodel(IDS)[0])
    with pytest.raises(ValueError, match="num_shared_layers=5"):
        create_reference_model(vmodel, num_shared_layers=5)


def test_peft_lora_policy_with_trainable_head(tokenizer, tmp_path):
    peft = pytest.importorskip("peft")
    base_dir = tmp_path / "base"
    tiny(tokenizer).save_pretrained(base_dir)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = AutoModelForCausalLMWithValueHead.from_pretrained(str(base_dir), peft_config=config)
    assert model.is_peft_model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("v_head.") for n in trainable)
    assert {"v_head.summary.weight", "v_head.summary.bias"} <= trainable
    with torch.no_grad():  # make the adapter and head non-trivial
        for name, p in model.named_parameters():
            if "lora_B" in name or name.startswith("v_head."):
                p.add_(0.1)
    model.eval()
    model.save_pretrained(tmp_path / "adapter")
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(str(tmp_path / "adapter")).eval()
    assert loaded.is_peft_model
    for a, b in zip(model(IDS), loaded(IDS)):
        if a is not None:
            torch.testing.assert_close(a, b)


def test_trl_v071_class_attributes_save_through_transformers_sharded(vmodel, tmp_path):
    """`transformers_parent_class` loads a saved (here sharded) value-head folder back as the plain LM, same
    weights; `lm_head_namings` names where the LM head lives; bf16 kwargs reach the language model."""
    assert AutoModelForCausalLMWithValueHead.transformers_parent_class is AutoModelForCausalLM
    assert any(hasattr(vmodel.pretrained_model, n) for n in AutoModelForCausalLMWithValueHead.lm_head_namings)
    vmodel.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    plain = AutoModelForCausalLMWithValueHead.transformers_parent_class.from_pretrained(tmp_path)
    for key, value in vmodel.pretrained_model.state_dict().items():
        torch.testing.assert_close(plain.state_dict()[key], value)
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(str(tmp_path))
    torch.testing.assert_close(loaded.v_head.summary.weight, vmodel.v_head.summary.weight)
    half = AutoModelForCausalLMWithValueHead.from_pretrained(str(tmp_path), torch_dtype=torch.bfloat16)
    assert half.pretrained_model.lm_head.weight.dtype == torch.bfloat16
    assert half(IDS)[2].shape == (2, 5)


def test_a_model_without_lm_head_is_refused(tokenizer, tmp_path):
    """TRL v0.7.1: a base model (no LM head, e.g. `AutoModel`'s) is a ValueError naming the class to load with."""
    from transformers import AutoModel

    tiny(tokenizer).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="has no language-model head.*AutoModelForCausalLM"):
        AutoModelForCausalLMWithValueHead.from_pretrained(AutoModel.from_pretrained(tmp_path))


def test_state_dict_is_trl_v071_layout_and_loads_back(vmodel, tokenizer):
    """`state_dict()` holds the language model's own keys plus `v_head.*` (TRL v0.7.1's layout: what
    `save_pretrained` writes), `load_state_dict` takes it (or the nn.Module layout), and a parent module still sees
    the nested `pretrained_model.*` keys."""
    state = vmodel.state_dict()
    assert set(state) == set(vmodel.pretrained_model.state_dict()) | {"v_head.summary.weight", "v_head.summary.bias"}
    other = AutoModelForCausalLMWithValueHead.from_pretrained(tiny(tokenizer, seed=1)).eval()
    assert not torch.equal(other(IDS)[2], vmodel(IDS)[2])
    other.load_state_dict(state)
    torch.testing.assert_close(other(IDS)[2], vmodel(IDS)[2])
    torch.testing.assert_close(other(IDS)[0], vmodel(IDS)[0])
    other.load_state_dict(torch.nn.Module.state_dict(vmodel))  # the prefixed layout works too
    parent = torch.nn.ModuleDict({"policy": vmodel})
    assert "policy.pretrained_model.lm_head.weight" in parent.state_dict()
    assert "policy.v_head.summary.bias" in parent.state_dict()
