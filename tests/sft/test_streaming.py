"""Streaming (`IterableDataset`) training data in SFT, as TRL accepts it: trained in order, max_steps required."""

import pytest
import torch

from replayrl import SFTTrainer
from replayrl.models.tiny import build_tokenizer
from tests.sft.helpers import addition_dataset, record, sft_args, trained_texts
from tests.sft.test_trainer import tiny


def test_streaming_dataset_trains_on_its_rows_in_order(tmp_path):
    tok = build_tokenizer()
    data = addition_dataset(12)
    args = sft_args(tmp_path, max_steps=3, per_device_train_batch_size=4)
    trainer = SFTTrainer(tiny(tok), args=args, train_dataset=data.to_iterable_dataset(), processing_class=tok)
    assert trainer.args.accelerator_config.dispatch_batches is False  # as TRL: each process reads its batches
    recorder = record(trainer)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    texts = [t for batch in recorder.batches for t in trained_texts(tok, batch)]
    assert texts == [c + "<|endoftext|>" for c in data["completion"]]  # completion-only loss, stream order
    assert all(not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters()))
    assert trainer.state.global_step == 3


def test_streaming_needs_max_steps_and_no_packing(tmp_path):
    tok = build_tokenizer()
    stream = addition_dataset(12).to_iterable_dataset()
    with pytest.raises(ValueError, match="max_steps must be set"):
        SFTTrainer(tiny(tok), args=sft_args(tmp_path, max_steps=-1), train_dataset=stream, processing_class=tok)
    with pytest.raises(ValueError, match="packing=True needs a map-style dataset"):
        SFTTrainer(tiny(tok), args=sft_args(tmp_path, packing=True), train_dataset=stream, processing_class=tok)


def test_streaming_with_a_formatting_func(tmp_path):
    tok = build_tokenizer()
    stream = addition_dataset(8).to_iterable_dataset()
    args = sft_args(tmp_path, max_steps=2, per_device_train_batch_size=4)
    trainer = SFTTrainer(
        tiny(tok), args=args, train_dataset=stream, processing_class=tok,
        formatting_func=lambda row: f"{row['prompt']}{row['completion']}",
    )  # fmt: skip
    recorder = record(trainer)
    trainer.train()
    texts = [t for batch in recorder.batches for t in trained_texts(tok, batch)]
    # language modeling: every token after the first is trained on
    assert texts == [
        f"{p}{c}<|endoftext|>"[1:] for p, c in zip(addition_dataset(8)["prompt"], addition_dataset(8)["completion"])
    ]


def test_evaluate_on_a_streaming_eval_dataset_gives_the_map_style_loss(tmp_path):
    # accelerate dispatches the batches of an IterableDataset (dispatch_batches=None): every collated value must
    # concatenate along the batch dimension, as TRL 1.16's collator's do
    tok = build_tokenizer()
    args = sft_args(tmp_path, per_device_eval_batch_size=3)  # 7 rows: the last batch is smaller
    trainer = SFTTrainer(
        tiny(tok), args=args, train_dataset=addition_dataset(8), processing_class=tok,
        eval_dataset=addition_dataset(7).to_iterable_dataset(),
    )  # fmt: skip
    assert trainer.args.accelerator_config.dispatch_batches is None  # left as the user set it
    from_init = trainer.evaluate()
    map_style = trainer.evaluate(eval_dataset=addition_dataset(7))
    streamed = trainer.evaluate(eval_dataset={"a": addition_dataset(7).to_iterable_dataset()})
    assert from_init["eval_loss"] == pytest.approx(map_style["eval_loss"], rel=1e-6)
    assert streamed["eval_a_loss"] == pytest.approx(map_style["eval_loss"], rel=1e-6)
    assert streamed["eval_mean_token_accuracy"] == pytest.approx(map_style["eval_mean_token_accuracy"])
