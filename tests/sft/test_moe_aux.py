"""The MoE router auxiliary loss in SFT (TRL's `router_aux_loss_coef`), through train() on a tiny Qwen2-MoE."""

import pytest
import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

from replayrl import SFTTrainer
from replayrl.models.tiny import build_tokenizer
from tests.sft.helpers import addition_dataset, sft_args


def tiny_moe(tokenizer, coef=0.02):
    config = Qwen2MoeConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
        shared_expert_intermediate_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=coef, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2MoeForCausalLM(config)


def first_log(tmp_path, coef, **overrides):
    tok = build_tokenizer()
    args = sft_args(tmp_path, max_steps=1, per_device_train_batch_size=8, router_aux_loss_coef=coef, **overrides)
    trainer = SFTTrainer(tiny_moe(tok), args=args, train_dataset=addition_dataset(8), processing_class=tok)
    trainer.train()
    return trainer, trainer.state.log_history[0]


def test_aux_loss_is_added_with_its_coefficient_and_logged(tmp_path):
    trainer, with_aux = first_log(tmp_path / "a", None)  # None: the config's 0.02, as TRL
    assert trainer.aux_loss_enabled and trainer.router_aux_loss_coef == 0.02
    _, without = first_log(tmp_path / "b", 0.0)
    assert "aux_loss" not in without
    # the batch is the same 8 rows and the weights start equal: the losses differ by exactly coef * aux
    assert with_aux["loss"] - without["loss"] == pytest.approx(0.02 * with_aux["aux_loss"], abs=1e-5)
    # the logged aux equals the model's own load-balancing loss on the same (2-D masked) batch
    tok = build_tokenizer()
    model = tiny_moe(tok)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(8)])
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_router_logits=True)
    assert with_aux["aux_loss"] == pytest.approx(out.aux_loss.item(), abs=1e-5)


def test_packed_rows_with_a_4d_mask_give_the_same_aux_loss(tmp_path):
    _, plain = first_log(tmp_path / "plain", None)
    _, packed = first_log(tmp_path / "packed", None, packing=True, max_length=64)
    assert packed["aux_loss"] == pytest.approx(plain["aux_loss"], abs=1e-4)
    assert packed["loss"] == pytest.approx(plain["loss"], abs=1e-4)


def test_a_coefficient_for_a_dense_model_is_refused(tmp_path):
    from tests.sft.test_trainer import tiny

    tok = build_tokenizer()
    with pytest.raises(ValueError, match="not a Mixture-of-Experts model"):
        SFTTrainer(tiny(tok), args=sft_args(tmp_path, router_aux_loss_coef=0.01), train_dataset=addition_dataset(),
                   processing_class=tok)  # fmt: skip
