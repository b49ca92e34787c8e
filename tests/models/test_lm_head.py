"""forward_to_head: fused where the logits are exactly lm_head(hidden), the logits elsewhere; the same log-probs."""

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM

from replayrl.models.lm_head import forward_to_head, fused_head
from replayrl.models.tiny import build_tiny_model, build_tokenizer


def tiny():
    return build_tiny_model(build_tokenizer(), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)


def check_stats_equal_full_logits(model, fused: bool):
    ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(0))
    outputs, head = forward_to_head(model, input_ids=ids, logits_to_keep=5)
    assert (head.weight is not None) == fused
    assert outputs.logits.shape[1] == (0 if fused else 5)
    targets = ids[:, -5:]
    stats = head.token_stats(targets, with_entropy=True, temperature=0.8)
    logits = model(input_ids=ids, logits_to_keep=5).logits.float() / 0.8
    logp = torch.log_softmax(logits, -1)
    torch.testing.assert_close(stats.logps, logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(stats.entropy, -(logp.exp() * logp).sum(-1))
    torch.testing.assert_close(head.mean_logits(), logits.mean(-1) * 0.8)


def test_qwen2_takes_the_fused_path_with_the_same_numbers():
    model = tiny()
    assert fused_head(model) is model.lm_head
    check_stats_equal_full_logits(model, fused=True)


def test_soft_capped_logits_take_the_logits_path():
    config = Gemma2Config(
        vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, final_logit_softcapping=5.0, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config)
    assert fused_head(model) is None
    check_stats_equal_full_logits(model, fused=False)


def test_lora_on_the_lm_head_takes_the_logits_path():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        tiny(), peft.LoraConfig(r=2, target_modules=["lm_head", "q_proj"], init_lora_weights=False)
    )
    assert fused_head(model) is None
    check_stats_equal_full_logits(model, fused=False)


def test_lora_on_the_body_keeps_the_fused_path():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny(), peft.LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    assert fused_head(model) is not None
    check_stats_equal_full_logits(model, fused=True)
