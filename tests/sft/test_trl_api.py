"""TRL 1.16 API points of SFT that TRL's own test file checks: plain TrainingArguments, evaluate() on a raw
(unprepared) dataset or a dict of them, a row's own `chat_template_kwargs` and `tools`."""

import warnings

import pytest
import torch
from datasets import Dataset
from transformers import TrainingArguments

from replayrl import SFTConfig, SFTTrainer
from replayrl.models.tiny import build_tiny_model, build_tokenizer
from tests.sft.helpers import addition_dataset, record, sft_args


def tiny(tokenizer):
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)


def test_training_arguments_become_an_sft_config(tmp_path):
    tok = build_tokenizer()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, learning_rate=3e-3, report_to="none", use_cpu=True)
    trainer = SFTTrainer(tiny(tok), args=args, train_dataset=addition_dataset(8), processing_class=tok)
    assert isinstance(trainer.args, SFTConfig)
    assert (trainer.args.learning_rate, trainer.args.max_steps) == (3e-3, 1)
    assert trainer.args.max_length == SFTConfig(output_dir=str(tmp_path)).max_length  # SFT's own default


def test_evaluate_prepares_a_raw_dataset_or_a_dict_of_them(tmp_path):
    tok = build_tokenizer()
    trainer = SFTTrainer(tiny(tok), args=sft_args(tmp_path), train_dataset=addition_dataset(8), processing_class=tok)
    raw = addition_dataset(4)
    assert "input_ids" not in raw.column_names
    assert trainer.evaluate(eval_dataset=raw)["eval_loss"] > 0
    metrics = trainer.evaluate(eval_dataset={"a": raw, "b": addition_dataset(6)})
    assert metrics["eval_a_loss"] > 0 and metrics["eval_b_loss"] > 0


# A ChatML template with two switches a row can set: `shout` upper-cases the role names, and `tools` are listed
# in a first line.
SWITCH_TEMPLATE = (
    "{% if tools %}{{ 'tools: ' + (tools | map(attribute='name') | join(',')) + '\n' }}{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + (m['role'] | upper if shout else m['role']) + '\n' + m['content']"
    " + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>' + ('ASSISTANT' if shout else 'assistant') + '\n' }}{% endif %}"
)


def chat(user: str, assistant: str) -> list[dict]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


def test_a_rows_chat_template_kwargs_and_tools_reach_its_template(tmp_path):
    tok = build_tokenizer()
    tok.chat_template = SWITCH_TEMPLATE
    data = Dataset.from_dict(
        {
            "messages": [chat("hi", "yo"), chat("ab", "cd")],
            "chat_template_kwargs": [{"shout": False}, {"shout": True}],
            "tools": [None, '[{"name": "add"}]'],  # JSON text, as TRL 1.16 reads it
        }
    )
    trainer = SFTTrainer(tiny(tok), args=sft_args(tmp_path), train_dataset=data, processing_class=tok)
    texts = [tok.decode(ids) for ids in trainer.train_dataset["input_ids"]]
    assert texts == [
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n",
        "tools: add\n<|im_start|>USER\nab<|im_end|>\n<|im_start|>ASSISTANT\ncd<|im_end|>\n",
    ]


def test_a_rows_chat_template_kwargs_shape_prompt_and_completion_alike(tmp_path):
    tok = build_tokenizer()
    tok.chat_template = SWITCH_TEMPLATE
    conversations = [chat("hi", "yo"), chat("ab", "cd")]
    data = Dataset.from_dict(
        {
            "prompt": [c[:1] for c in conversations],
            "completion": [c[1:] for c in conversations],
            "chat_template_kwargs": [{"shout": False}, {"shout": True}],
        }
    )
    trainer = SFTTrainer(tiny(tok), args=sft_args(tmp_path), train_dataset=data, processing_class=tok)
    rows = trainer.train_dataset
    # the prompt is rendered with the row's kwargs too, so the completion's labels start right after it
    completions = [tok.decode([t for t in r["labels"] if t != -100]) for r in rows]
    assert completions == ["yo<|im_end|>\n", "cd<|im_end|>\n"]
    assert tok.decode(rows[1]["input_ids"]).startswith("<|im_start|>USER\nab")


def test_sharegpt_conversations_are_trained_as_chatml_messages(tmp_path):
    tok = build_tokenizer()
    conversations = [chat("hi", "yo"), chat("ab", "cd")]
    sharegpt = [[{"from": m["role"], "value": m["content"]} for m in c] for c in conversations]
    data = Dataset.from_dict({"conversations": sharegpt, "source": ["x", "y"]})
    trainer = SFTTrainer(tiny(tok), args=sft_args(tmp_path), train_dataset=data, processing_class=tok)
    chatml = SFTTrainer(
        tiny(tok), args=sft_args(tmp_path), train_dataset=Dataset.from_dict({"messages": conversations}),
        processing_class=tok,
    )  # fmt: skip
    assert trainer.train_dataset["input_ids"] == chatml.train_dataset["input_ids"]
    assert tok.decode(trainer.train_dataset[0]["input_ids"]).startswith("<|im_start|>user\nhi<|im_end|>")
    trainer.train()
    assert trainer.state.log_history[0]["loss"] > 0


def test_maybe_convert_to_chatml_as_trl():
    from replayrl import is_conversational_from_value, maybe_convert_to_chatml

    row = {"conversations": [{"from": "human", "value": "q"}], "prompt": [{"from": "user", "value": "p"}]}
    assert is_conversational_from_value(row)
    assert not is_conversational_from_value({"conversations": [{"role": "user", "content": "q"}]})
    assert not is_conversational_from_value({"conversations": "text"})
    assert maybe_convert_to_chatml(row) == {
        "prompt": [{"role": "user", "content": "p"}],
        "messages": [{"role": "human", "content": "q"}],  # role names kept, as TRL
    }


def test_a_dataset_with_a_transform_is_refused_before_loading_unless_preparation_is_skipped(tmp_path):
    tok = build_tokenizer()

    def shout(batch):  # a transform runs at every read: `map` would bake one draw of it into the tokens
        return {"text": [t.upper() for t in batch["text"]]}

    data = Dataset.from_dict({"text": ["hello world", "abc"]}).with_transform(shout)
    refused = r"Dataset\.with_transform\(\).*skip_prepare_dataset.*trainer-ready"
    with pytest.raises(ValueError, match=refused):  # a model name that does not exist: refused before loading
        SFTTrainer(str(tmp_path / "no-model"), args=sft_args(tmp_path), train_dataset=data, processing_class=tok)
    plain = Dataset.from_dict({"text": ["hello world", "abc"]})
    with pytest.raises(ValueError, match=refused):
        SFTTrainer(tiny(tok), args=sft_args(tmp_path), train_dataset=plain, eval_dataset={"a": data})
    trainer = SFTTrainer(tiny(tok), args=sft_args(tmp_path), train_dataset=plain, processing_class=tok)
    with pytest.raises(ValueError, match=refused):
        trainer.evaluate(eval_dataset=data)

    def ready(batch):  # trainer-ready rows, as TRL's message asks for
        return {"input_ids": [tok(t.upper()).input_ids + [tok.eos_token_id] for t in batch["text"]]}

    args = sft_args(tmp_path, dataset_kwargs={"skip_prepare_dataset": True}, remove_unused_columns=False)
    raw = Dataset.from_dict({"text": ["hello world", "abc"]})
    trainer = SFTTrainer(tiny(tok), args=args, train_dataset=raw.with_transform(ready), processing_class=tok)
    recorder = record(trainer)
    trainer.train()
    assert tok.decode(recorder.batches[0]["input_ids"][0]).startswith("HELLO WORLD")


def test_padding_free_without_packing_refuses_a_max_length_before_loading(tmp_path):
    tok = build_tokenizer()
    args = sft_args(tmp_path, padding_free=True, max_length=16)
    with pytest.raises(ValueError, match=r"`max_length` is not enforced.*max_length=16"):
        SFTTrainer(str(tmp_path / "no-model"), args=args, train_dataset=addition_dataset(4), processing_class=tok)
    for setting in ({"max_length": None}, {"packing": True, "max_length": 16}):  # the two ways out
        args = sft_args(tmp_path, padding_free=True, **setting)
        trainer = SFTTrainer(tiny(tok), args=args, train_dataset=addition_dataset(4), processing_class=tok)
        assert trainer.train().training_loss > 0


def test_chunked_nll_is_trl_1_16s_deprecated_alias_of_nll(tmp_path):
    with pytest.warns(FutureWarning, match="`loss_type='chunked_nll'` is deprecated"):
        args = SFTConfig(output_dir=str(tmp_path), loss_type="chunked_nll", report_to="none")
    assert args.loss_type == "nll"


@pytest.mark.parametrize("setting", [{}, {"packing": True, "max_length": 8}], ids=["rows", "packed"])
def test_a_pretokenized_labels_column_is_trained_as_given(tmp_path, setting):
    tok = build_tokenizer()
    # as TRL 1.16: a row's own labels decide alone (the all-ones assistant mask is not applied on top)
    rows = [
        {"input_ids": [10, 11, 12, 13], "labels": [10, -100, 12, -100], "assistant_masks": [1, 1, 1, 1]},
        {"input_ids": [20, 21, 22], "labels": [-100, -100, 22], "assistant_masks": [1, 1, 1]},
    ]
    args = sft_args(tmp_path, per_device_train_batch_size=2, max_steps=1, **setting)
    trainer = SFTTrainer(tiny(tok), args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    kept = sorted(label for row in trainer.train_dataset["labels"] for label in row)
    assert kept == sorted(label for r in rows for label in r["labels"])  # carried through packing too
    assert ("seq_lengths" in trainer.train_dataset.column_names) == bool(setting)
    recorder = record(trainer)
    trainer.train()
    trained = sorted(t for t in recorder.batches[0]["labels"][:, 1:].flatten().tolist() if t != -100)
    assert trained == [12, 22]  # position 0 of each document is never a target


def test_a_pretokenized_labels_column_is_truncated_with_the_ids(tmp_path):
    tok = build_tokenizer()
    rows = [{"input_ids": [10, 11, 12, 13, 14, 15], "labels": [-100, 11, -100, 13, 14, 15]}]
    for mode, expected in (("keep_start", [-100, 11, -100, 13]), ("keep_end", [-100, 13, 14, 15])):
        args = sft_args(tmp_path, max_length=4, truncation_mode=mode)
        trainer = SFTTrainer(tiny(tok), args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
        assert trainer.train_dataset["labels"] == [expected]


def test_padding_free_refuses_a_custom_collator_and_warns_for_one_row_batches(tmp_path, caplog):
    from replayrl.sft import DataCollatorForLanguageModeling

    tok = build_tokenizer()
    args = sft_args(tmp_path, padding_free=True, max_length=None, per_device_train_batch_size=1)
    collator = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)
    with pytest.raises(ValueError, match="custom data collator is not supported when using padding-free"):
        SFTTrainer(
            str(tmp_path / "no-model"), args=args, train_dataset=addition_dataset(4), processing_class=tok,
            data_collator=collator,
        )  # fmt: skip
    with caplog.at_level("WARNING", logger="replayrl.sft.trainer"):
        SFTTrainer(tiny(tok), args=args, train_dataset=addition_dataset(4), processing_class=tok)
    assert "per_device_train_batch_size of 1 with padding-free" in caplog.text
    caplog.clear()
    args = sft_args(tmp_path, padding_free=True, max_length=None, per_device_train_batch_size=2)
    with caplog.at_level("WARNING", logger="replayrl.sft.trainer"):
        SFTTrainer(tiny(tok), args=args, train_dataset=addition_dataset(4), processing_class=tok)
    assert "padding-free" not in caplog.text


def test_predict_and_compute_metrics_get_the_models_full_logits(tmp_path):
    tok = build_tokenizer()
    seen = []

    def compute_metrics(prediction):
        seen.append(prediction.predictions.shape)
        return {"rows": float(prediction.predictions.shape[0])}

    args = sft_args(tmp_path, per_device_eval_batch_size=4)
    data = addition_dataset(4)
    trainer = SFTTrainer(tiny(tok), args=args, train_dataset=data, processing_class=tok)
    with warnings.catch_warnings():  # a loss-only evaluate() keeps the fused head: no logits, no warning
        warnings.simplefilter("error", FutureWarning)
        loss_only = trainer.evaluate(eval_dataset=data)
    with pytest.warns(FutureWarning, match="`return_outputs=True`"):
        predicted = trainer.predict(trainer.train_dataset)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    with torch.no_grad():
        logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(torch.from_numpy(predicted.predictions), logits)  # as TRL 1.16: real logits
    assert predicted.metrics["test_loss"] == pytest.approx(loss_only["eval_loss"], rel=1e-5)
    trainer.compute_metrics = compute_metrics
    with pytest.warns(FutureWarning, match="`return_outputs=True`"):
        metrics = trainer.evaluate(eval_dataset=data)
    assert seen == [(4, logits.shape[1], logits.shape[2])] and metrics["eval_rows"] == 4.0


def test_compute_loss_func_is_deprecated_and_refused_with_dft(tmp_path):
    tok = build_tokenizer()

    def loss_func(outputs, labels, num_items_in_batch=None):
        return outputs.logits.float().logsumexp(-1).mean()

    with pytest.raises(ValueError, match="`compute_loss_func` together with `loss_type='dft'`"):
        SFTTrainer(
            str(tmp_path / "no-model"), args=sft_args(tmp_path, loss_type="dft"), train_dataset=addition_dataset(4),
            processing_class=tok, compute_loss_func=loss_func,
        )  # fmt: skip
    with pytest.warns(FutureWarning, match="`compute_loss_func` is deprecated"):
        trainer = SFTTrainer(
            tiny(tok), args=sft_args(tmp_path), train_dataset=addition_dataset(4), processing_class=tok,
            compute_loss_func=loss_func,
        )  # fmt: skip
    assert trainer.train().training_loss > 0
