"""SFT with prompt-learning PEFT adapters (prompt tuning, p-tuning, prefix tuning) through the public API.

Prompt tuning and p-tuning prepend virtual tokens to the model's outputs; the fused LM head must score the real
tokens only, with PEFT's own loss: `model(input_ids, labels=...)` of the PEFT model, whose last virtual position
predicts the first real token.
"""

import pytest
import torch
from datasets import Dataset

from replayrl import SFTTrainer
from replayrl.models.tiny import build_tiny_model, build_tokenizer
from tests.sft.helpers import addition_dataset, sft_args

peft = pytest.importorskip("peft")


def adapter(kind: str):
    if kind == "prompt_tuning":
        return peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    if kind == "p_tuning":
        return peft.PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=4, encoder_hidden_size=16)
    return peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)


def texts() -> Dataset:
    return Dataset.from_dict({"text": ["hello world", "3+4=7", "packing!", "a", "soft prompts", "b=2"]})


def tiny(tok):
    return build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


@pytest.mark.parametrize("kind", ["prompt_tuning", "p_tuning", "prefix_tuning"])
def test_fused_loss_equals_peft_models_own_loss(tmp_path, kind):
    tok = build_tokenizer()
    trainer = SFTTrainer(
        tiny(tok), sft_args(tmp_path), train_dataset=texts(), processing_class=tok, peft_config=adapter(kind)
    )
    model = trainer.model.eval()  # eval: no dropout, and no division by the accumulation steps
    batch = next(iter(trainer.get_train_dataloader()))
    first = 1 if kind == "prefix_tuning" else 0  # prefix tuning keeps the length: no position before token 0
    assert (batch["labels"][:, 0] != -100).all() == (first == 0)  # the soft prompt predicts the first token
    loss = trainer.compute_loss(model, dict(batch))
    want = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
    torch.testing.assert_close(loss, want)
    trained = [p for p in model.parameters() if p.requires_grad]
    for got, expected in zip(torch.autograd.grad(loss, trained), torch.autograd.grad(want, trained)):
        torch.testing.assert_close(got, expected)
    _, _, n, _ = trainer._sums["eval"].tolist()
    assert n == (batch["labels"][:, first:] != -100).sum().item()
    assert trainer._get_num_items_in_batch([batch], torch.device("cpu")).item() == n  # the step's normaliser


@pytest.mark.parametrize("kind", ["prompt_tuning", "p_tuning"])
def test_train_updates_only_the_prompt(tmp_path, kind):
    tok = build_tokenizer()
    model = tiny(tok)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = sft_args(tmp_path, max_steps=3, learning_rate=1e-1, gradient_accumulation_steps=2)
    trainer = SFTTrainer(model, args, train_dataset=addition_dataset(), processing_class=tok, peft_config=adapter(kind))
    prompt = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    assert prompt and all(not torch.equal(p, trainer.model.get_parameter(n)) for n, p in prompt.items())
    assert all(torch.equal(p, trainer.model.get_base_model().get_parameter(n)) for n, p in base.items())
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert logged and all(h["mean_token_accuracy"] >= 0 for h in logged)


@pytest.mark.parametrize("setting", [{"packing": True}, {"padding_free": True, "max_length": None}])
def test_packing_is_refused_with_prompt_learning(tmp_path, setting):
    tok = build_tokenizer()
    with pytest.raises(ValueError, match=r"prompt-learning PEFT \(PromptTuningConfig\).*Set (packing|padding_free)"):
        SFTTrainer(
            tiny(tok),
            sft_args(tmp_path, **setting),
            train_dataset=addition_dataset(),
            processing_class=tok,
            peft_config=adapter("prompt_tuning"),
        )


def test_moe_router_loss_counts_the_virtual_tokens_as_peft_does(tmp_path):
    from tests.sft.test_moe_aux import tiny_moe

    tok = build_tokenizer()
    args = sft_args(tmp_path, per_device_train_batch_size=6)
    trainer = SFTTrainer(
        tiny_moe(tok), args, train_dataset=texts(), processing_class=tok, peft_config=adapter("p_tuning")
    )
    model = trainer.model.eval()
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        trainer.compute_loss(model, dict(batch))
        # PEFT prepends 1s to the attention mask, so the model's own aux loss counts the 4 virtual tokens per row
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_router_logits=True)
    aux, count = trainer._aux_sums["eval"].tolist()
    assert count == 1 and aux == pytest.approx(out.aux_loss.item(), abs=1e-5)
