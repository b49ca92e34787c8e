import json

import pytest
import torch
from datasets import Dataset

from replayrl import SFTConfig, SFTTrainer
from replayrl.models.tiny import build_tiny_model, build_tokenizer
from tests.data.chat import GENERATION_TEMPLATE, chat_tokenizer, conversation
from tests.sft.helpers import addition_dataset, record, sft_args, trained_texts


def tiny(tokenizer, seed=0):
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=seed)


def losses(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("loss_type", ["nll", "dft"])
def test_loss_decreases_on_addition(tmp_path, loss_type):
    tok = build_tokenizer()
    args = sft_args(tmp_path, max_steps=30, per_device_train_batch_size=8, loss_type=loss_type)
    trainer = SFTTrainer(tiny(tok), args=args, train_dataset=addition_dataset(), processing_class=tok)
    trainer.train()
    values = losses(trainer)
    assert sum(values[-5:]) / 5 < 0.6 * sum(values[:5]) / 5, values
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "loss" in r]
    assert {"mean_token_accuracy", "entropy", "num_tokens"} <= set(logged[-1])
    assert logged[-1]["mean_token_accuracy"] > logged[0]["mean_token_accuracy"]


def test_completion_only_loss_trains_on_completion_and_eos_only(tmp_path):
    tok = build_tokenizer()
    data = addition_dataset()
    trainer = SFTTrainer(tiny(tok), args=sft_args(tmp_path), train_dataset=data, processing_class=tok)
    recorder = record(trainer)
    trainer.train()
    texts = [t for batch in recorder.batches for t in trained_texts(tok, batch)]
    assert len(texts) == 8 and set(texts) <= {c + "<|endoftext|>" for c in data["completion"]}
    # with completion_only_loss=False the prompt is trained on too (the first token has no prediction)
    trainer = SFTTrainer(
        tiny(tok), args=sft_args(tmp_path, completion_only_loss=False), train_dataset=data, processing_class=tok
    )
    recorder = record(trainer)
    trainer.train()
    full = {p[1:] + c + "<|endoftext|>" for p, c in zip(data["prompt"], data["completion"])}
    assert set(trained_texts(tok, recorder.batches[0])) <= full


def chat_dataset(n=8):
    return Dataset.from_dict({"messages": [conversation(f"add {i} and 1", str(i + 1)) for i in range(n)]})


def test_assistant_only_loss_trains_on_assistant_turns_only(tmp_path):
    tok = chat_tokenizer()
    args = sft_args(tmp_path, assistant_only_loss=True)
    trainer = SFTTrainer(tiny(tok), args=args, train_dataset=chat_dataset(), processing_class=tok)
    recorder = record(trainer)
    trainer.train()
    texts = [t for batch in recorder.batches for t in trained_texts(tok, batch)]
    assert len(texts) == 8 and set(texts) <= {f"{i + 1}<|im_end|>" for i in range(8)}


def test_assistant_only_loss_with_chat_template_path(tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text(GENERATION_TEMPLATE)
    tok = build_tokenizer()  # its own ChatML template has no generation marks
    with pytest.raises(ValueError, match="generation"):
        SFTTrainer(tiny(tok), sft_args(tmp_path, assistant_only_loss=True), train_dataset=chat_dataset(), tokenizer=tok)
    args = sft_args(tmp_path, assistant_only_loss=True, chat_template_path=str(path), max_steps=1)
    trainer = SFTTrainer(tiny(tok), args=args, train_dataset=chat_dataset(), processing_class=tok)
    recorder = record(trainer)
    trainer.train()
    assert set(trained_texts(tok, recorder.batches[0])) <= {f"{i + 1}<|im_end|>" for i in range(8)}


def one_step(tmp_path, name, data, **overrides):
    """Loss of one SGD step and the parameters after it."""
    tok = build_tokenizer()
    args = sft_args(tmp_path / name, max_steps=1, optim="sgd", learning_rate=0.5, **overrides)
    trainer = SFTTrainer(tiny(tok), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    return losses(trainer)[0], torch.cat([p.detach().flatten() for p in trainer.model.parameters()])


def test_gradient_accumulation_8x1_equals_1x8(tmp_path):
    # completions of very different lengths: a per-micro-batch mean would weight the tokens differently
    completions = ["1", "123456789", "12", "1234", "1234567", "123", "12345", "123456"]
    data = Dataset.from_dict({"prompt": [f"{c}=" for c in "abcdefgh"], "completion": completions})
    loss_a, params_a = one_step(tmp_path, "8x1", data, per_device_train_batch_size=8)
    loss_b, params_b = one_step(tmp_path, "1x8", data, per_device_train_batch_size=1, gradient_accumulation_steps=8)
    assert loss_a == pytest.approx(loss_b, abs=1e-5)
    assert torch.allclose(params_a, params_b, atol=1e-6), (params_a - params_b).abs().max()


# padding_free without packing takes max_length=None (TRL 1.16 refuses a max_length there)
PACKED = [{"packing": True, "max_length": 32}, {"padding_free": True, "max_length": None}]


@pytest.mark.parametrize("setting", PACKED)
def test_packed_and_padding_free_training_equal_unpacked(tmp_path, setting):
    data = addition_dataset(12)
    loss_a, params_a = one_step(tmp_path, "plain", data, per_device_train_batch_size=12)
    loss_b, params_b = one_step(tmp_path, "packed", data, per_device_train_batch_size=12, **setting)
    assert loss_a == pytest.approx(loss_b, abs=1e-5)
    assert torch.allclose(params_a, params_b, atol=1e-5), (params_a - params_b).abs().max()


def test_packed_rows_and_token_count(tmp_path):
    tok = build_tokenizer()
    args = sft_args(tmp_path, packing=True, max_length=32, max_steps=1, per_device_train_batch_size=8)
    trainer = SFTTrainer(tiny(tok), args=args, train_dataset=addition_dataset(), processing_class=tok)
    rows = trainer.train_dataset
    assert all(len(ids) <= 32 and sum(s) == len(ids) for ids, s in zip(rows["input_ids"], rows["seq_lengths"]))
    trainer.train()
    total = sum(len(ids) for ids in rows["input_ids"])
    assert trainer.state.log_history[0]["num_tokens"] == total  # 25 documents fit in one batch of rows


def test_num_tokens_counts_every_token_once(tmp_path):
    tok = build_tokenizer()
    data = addition_dataset(12)
    args = sft_args(tmp_path, max_steps=3, per_device_train_batch_size=4)  # 3 steps x 4 rows: each row once
    trainer = SFTTrainer(tiny(tok), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    rows = trainer.train_dataset
    total = sum(len(ids) for ids in rows["input_ids"])
    counts = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
    assert len(counts) == 3 and counts[-1] == total  # cumulative, as TRL's
    assert counts[0] < counts[1] < counts[2]
    assert "train_runtime" in trainer.state.log_history[-1] and "num_tokens" not in trainer.state.log_history[-1]


def test_seed_constructor_names(tmp_path):
    tok = build_tokenizer()
    data = Dataset.from_dict({"content": ["hello there", "general kenobi", "abc"]})
    args = sft_args(tmp_path, max_steps=1)
    trainer = SFTTrainer(
        tiny(tok),
        args=args,
        train_dataset=data,
        tokenizer=tok,
        dataset_text_field="content",
        packing=True,
        max_seq_length=16,
    )
    assert trainer.args.max_length == 16 and trainer.args.packing and trainer.processing_class is tok
    assert "seq_lengths" in trainer.train_dataset.column_names
    trainer.train()
    with pytest.warns(FutureWarning, match="max_length"):
        assert SFTConfig(output_dir=str(tmp_path), max_seq_length=48, report_to="none").max_length == 48


def test_seed_batched_formatting_func(tmp_path):
    tok = build_tokenizer()
    data = Dataset.from_dict({"question": ["1+1", "2+2"], "answer": ["2", "4"]})

    def formatting_func(batch):
        return [f"Q: {q} A: {a}" for q, a in zip(batch["question"], batch["answer"])]

    trainer = SFTTrainer(
        tiny(tok), sft_args(tmp_path), train_dataset=data, tokenizer=tok, formatting_func=formatting_func
    )
    assert tok.decode(trainer.train_dataset[0]["input_ids"]) == "Q: 1+1 A: 2<|endoftext|>"


def test_model_by_path_and_evaluation(tmp_path, model_dir):
    args = sft_args(tmp_path, max_steps=1, per_device_eval_batch_size=8)
    trainer = SFTTrainer(model_dir, args=args, train_dataset=addition_dataset(), eval_dataset=addition_dataset(8))
    metrics = trainer.evaluate()
    assert {"eval_loss", "eval_mean_token_accuracy", "eval_entropy"} <= set(metrics)


def test_peft_trains_only_the_adapter(tmp_path):
    from peft import LoraConfig

    tok = build_tokenizer()
    model = tiny(tok)
    base = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = SFTTrainer(
        model, sft_args(tmp_path), train_dataset=addition_dataset(), processing_class=tok, peft_config=peft_config
    )
    trainer.train()
    trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trained and all("lora" in n for n in trained)
    assert torch.equal(trainer.model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight, base)


def test_bad_input_errors(tmp_path):
    tok = build_tokenizer()
    model = tiny(tok)
    preference = Dataset.from_dict({"chosen": ["a"], "rejected": ["b"]})
    with pytest.raises(ValueError, match="DPOTrainer or RewardTrainer"):
        SFTTrainer(model, sft_args(tmp_path), train_dataset=preference, processing_class=tok)
    with pytest.raises(ValueError, match=r"columns \['question'\]"):
        SFTTrainer(model, sft_args(tmp_path), train_dataset=Dataset.from_dict({"question": ["q"]}), tokenizer=tok)
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['bogus'\\]"):
        SFTTrainer(model, sft_args(tmp_path), train_dataset=addition_dataset(), tokenizer=tok, bogus=True)
    with pytest.warns(UserWarning, match="ignores TRL v0.7.1's ConstantLengthDataset arguments \\['infinite'\\]"):
        SFTTrainer(model, sft_args(tmp_path), train_dataset=addition_dataset(), tokenizer=tok, infinite=True)
    with pytest.raises(ValueError, match="Expected a datasets.Dataset or datasets.IterableDataset, got list"):
        SFTTrainer(model, sft_args(tmp_path), train_dataset=[{"text": "a"}], tokenizer=tok)
    with pytest.raises(ValueError, match="loss_type='mse'"):
        sft_args(tmp_path, loss_type="mse")
    with pytest.raises(ValueError, match="packing=True needs max_length"):
        sft_args(tmp_path, packing=True, max_length=None)
    with pytest.raises(ValueError, match="args must be an SFTConfig"):  # TrainingArguments are taken (test_trl_api)
        SFTTrainer(model, {"output_dir": str(tmp_path)}, train_dataset=addition_dataset(), tokenizer=tok)


def test_compute_loss_func_and_skip_prepare_dataset(tmp_path):
    tok = build_tokenizer()
    calls = []

    def my_loss(outputs, labels, num_items_in_batch=None):
        calls.append(int(num_items_in_batch))
        return outputs.logits.float().pow(2).mean()

    rows = Dataset.from_dict({"input_ids": [[5, 6, 7], [8, 9]]})
    args = sft_args(tmp_path, max_steps=1, dataset_kwargs={"skip_prepare_dataset": True})
    trainer = SFTTrainer(tiny(tok), args, train_dataset=rows, processing_class=tok, compute_loss_func=my_loss)
    assert trainer.train_dataset is rows
    trainer.train()
    assert calls == [3]  # labels after the shift: 2 + 1 tokens


def test_sft_checkpoints_are_complete_and_resume_true_picks_them(tmp_path):
    """SFT saves through the shared safe-checkpoint mechanism: completeness marker, resume=True, no mixing."""
    from replayrl.checkpoints import COMPLETE_MARKER

    tok = build_tokenizer()

    def run(resume=None, **overrides):
        args = sft_args(tmp_path, save_strategy="steps", save_steps=1, **overrides)
        trainer = SFTTrainer(tiny(tok), args=args, train_dataset=addition_dataset(), processing_class=tok)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    first = run()
    assert (tmp_path / "out" / "checkpoint-2" / COMPLETE_MARKER).exists()
    with pytest.raises(ValueError, match="already holds checkpoints"):
        run()
    resumed = run(resume=True, max_steps=3)
    assert resumed.state.global_step == 3
    # num_tokens is a running total: it goes on from the checkpoint's (was restarted from 0 on resume)
    counts = [h["num_tokens"] for h in resumed.state.log_history if "num_tokens" in h]
    assert counts[:2] == [h["num_tokens"] for h in first.state.log_history if "num_tokens" in h]
    assert counts[2] > counts[1]


@pytest.mark.parametrize("loss_type", ["nll", "dft"])
def test_fused_head_loss_and_metrics_equal_the_plain_full_logits_ones(tmp_path, loss_type):
    """compute_loss never forms the logits (the model returns (B, 0, V)) and gives the loss, gradients and metrics
    of the plain full-vocabulary computation."""
    tok = build_tokenizer()
    args = sft_args(tmp_path, loss_type=loss_type)
    trainer = SFTTrainer(tiny(tok), args, train_dataset=addition_dataset(8), processing_class=tok)
    model = trainer.model
    batch = next(iter(trainer.get_train_dataloader()))
    count = (batch["labels"][:, 1:] != -100).sum()
    widths = []  # the lm_head's own output: (B, 0, V) when the logits are never formed
    hook = model.get_output_embeddings().register_forward_hook(lambda m, i, out: widths.append(out.shape[1]))
    loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=count)
    hook.remove()
    assert widths == [0]
    fused_grads = torch.autograd.grad(loss, list(model.parameters()))
    plain_inputs = {k: v for k, v in batch.items() if k not in ("labels", "token_count")}
    logits = model(**plain_inputs, use_cache=False).logits[:, :-1].float()
    targets = batch["labels"][:, 1:]
    mask = targets != -100
    logp = torch.log_softmax(logits, -1)
    token_logps = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    per_token = -token_logps if loss_type == "nll" else -token_logps.detach().exp() * token_logps
    plain = (per_token * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, plain)
    for got, want in zip(fused_grads, torch.autograd.grad(plain, list(model.parameters()))):
        torch.testing.assert_close(got, want)
    correct, entropy, n, _ = trainer._sums["train"].tolist()
    assert n == mask.sum().item()
    assert correct == ((logits.argmax(-1) == targets) & mask).sum().item()
    assert entropy == pytest.approx((-(logp.exp() * logp).sum(-1) * mask).sum().item(), rel=1e-5)
