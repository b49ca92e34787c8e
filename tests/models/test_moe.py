"""MoE router load-balancing loss: hand values, transformers' function as the reference, capture from a tiny
Qwen2-MoE / Mixtral built from configs."""

import math

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM
from transformers.models.qwen2_moe.modeling_qwen2_moe import load_balancing_loss_func

from replayrl.algos.moe import load_balancing_loss
from replayrl.models.moe import RouterLogits, router_aux_settings


def test_hand_values():
    logits = [torch.tensor([[math.log(3.0), 0.0], [0.0, math.log(3.0)]])]  # probs (.75,.25), (.25,.75)
    # top-1: one token per expert, f = (.5, .5); P = (.5, .5): 2 * (.25 + .25)
    assert load_balancing_loss(logits, top_k=1).item() == pytest.approx(1.0)
    # the second token masked out: f = (1, 0), P = (.75, .25): 2 * .75
    assert load_balancing_loss(logits, top_k=1, token_mask=torch.tensor([1, 0])).item() == pytest.approx(1.5)


def test_equals_transformers_function_with_a_2d_mask():
    torch.manual_seed(0)
    layers = tuple(torch.randn(2 * 5, 4) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    expected = load_balancing_loss_func(layers, num_experts=4, top_k=2, attention_mask=mask)
    assert load_balancing_loss(list(layers), 2, mask).item() == pytest.approx(expected.item(), abs=1e-6)


def tiny_moe(kind: str):
    common = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  num_experts_per_tok=2, router_aux_loss_coef=0.02, pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    if kind == "qwen2_moe":
        config = Qwen2MoeConfig(num_experts=4, moe_intermediate_size=8, shared_expert_intermediate_size=8,
                                intermediate_size=32, **common)  # fmt: skip
        return Qwen2MoeForCausalLM(config)
    return MixtralForCausalLM(MixtralConfig(num_local_experts=4, intermediate_size=8, **common))


@pytest.mark.parametrize("kind", ["qwen2_moe", "mixtral"])
def test_captured_router_logits_give_the_models_own_aux_loss(kind):
    model = tiny_moe(kind)
    ids, mask = torch.randint(1, 40, (2, 6)), torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with RouterLogits(model) as routers:
        out = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
    assert len(routers.logits) == 2 and routers.logits[0].shape == (12, 4)
    assert routers.aux_loss(mask, top_k=2).item() == pytest.approx(out.aux_loss.item(), abs=1e-6)
    assert router_aux_settings(model, None) == (True, 0.02)  # TRL: the config's coefficient by default
    assert router_aux_settings(model, 0.0) == (False, 0.0)


def test_a_coefficient_for_a_dense_model_is_refused(model):
    assert router_aux_settings(model, None) == (False, 0.0)
    with pytest.raises(ValueError, match="not a Mixture-of-Experts model"):
        router_aux_settings(model, 0.01)
