"""TRL 1.16 API points of DPO that TRL's own test file checks: `aot_unpaired`, precomputed reference log-probs
with streaming or several eval datasets, TRL's error wording, and the pairs `keep_start` would leave without a
completion token dropped at preparation."""

import logging
import math

import pytest
import torch
from datasets import Dataset, IterableDatasetDict

from replayrl.algos.preference import PairLogps, dpo_losses
from replayrl.dpo import DPOTrainer
from tests.dpo.test_trainer import dpo_args, pairs_data, tiny  # noqa: F401


def test_aot_unpaired_is_trls_name_for_aot_pair():
    g = torch.Generator().manual_seed(0)
    pairs = PairLogps(*(torch.randn(6, generator=g) for _ in range(4)))
    unpaired = dpo_losses("aot_unpaired", pairs, beta=0.1)[0]
    assert torch.equal(unpaired, dpo_losses("aot_pair", pairs, beta=0.1)[0])
    assert not torch.allclose(unpaired, dpo_losses("aot", pairs, beta=0.1)[0])  # the other AOT variant


def test_precompute_refuses_streaming_eval_datasets_in_trls_words(tokenizer, pairs_data, tmp_path):  # noqa: F811
    args = dpo_args(tmp_path, precompute_ref_log_probs=True)
    stream = pairs_data[1].select(range(4)).to_iterable_dataset()
    for eval_dataset in (stream, {"a": stream}, IterableDatasetDict({"a": stream})):
        with pytest.raises(ValueError, match="precompute_ref_log_probs.*not supported with IterableDataset"):
            DPOTrainer(tiny(tokenizer), args=args, train_dataset=pairs_data[0], eval_dataset=eval_dataset,
                       processing_class=tokenizer)  # fmt: skip
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=pairs_data[0], processing_class=tokenizer)
    with pytest.raises(ValueError, match="precompute_ref_log_probs.*not supported with IterableDataset"):
        trainer.evaluate(eval_dataset=stream)


def test_precompute_evaluates_a_dict_of_new_eval_datasets(tokenizer, pairs_data, tmp_path):  # noqa: F811
    args = dpo_args(tmp_path, precompute_ref_log_probs=True)
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=pairs_data[0], processing_class=tokenizer)
    held_out = pairs_data[1].select(range(4))
    metrics = trainer.evaluate(eval_dataset={"a": held_out, "b": held_out})
    assert metrics["eval_a_loss"] == pytest.approx(math.log(2), abs=1e-6)  # the policy is still the reference
    assert metrics["eval_b_loss"] == pytest.approx(math.log(2), abs=1e-6)
    trainer.train()
    with pytest.raises(ValueError, match="Cannot compute reference log-probs for a dataset passed to"):
        trainer.evaluate(eval_dataset=held_out)


def long_prompt_pairs():
    long = "This is a very long prompt that fills up the whole max_length budget on its own"
    return Dataset.from_dict({"prompt": ["Hi", long], "chosen": [" there", " yes"], "rejected": [" bye", " no"]})


def test_keep_start_drops_pairs_whose_prompt_fills_max_length(tokenizer, tmp_path, caplog):
    """TRL's test_fully_truncated_completion_examples_dropped: with keep_start the collator would keep no completion
    token of the long-prompt pair, so it is dropped at preparation (train and eval), with a warning."""
    args = dpo_args(tmp_path, max_length=6, truncation_mode="keep_start")
    with caplog.at_level(logging.WARNING, logger="replayrl.data.preference"):
        trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=long_prompt_pairs(),
                             eval_dataset=long_prompt_pairs(), processing_class=tokenizer)  # fmt: skip
    assert len(trainer.train_dataset) == 1 and len(trainer.eval_dataset) == 1
    assert trainer.train_dataset[0]["prompt_ids"] == tokenizer("Hi", add_special_tokens=False)["input_ids"]
    assert "train_dataset: dropped 1 of 2 pairs whose prompt fills max_length=6" in caplog.text
    trainer.train()
    assert "eval_loss" in trainer.evaluate(eval_dataset=long_prompt_pairs())  # a dataset given here: the same

    stream_args = dpo_args(tmp_path, max_length=6, truncation_mode="keep_start", max_steps=1)
    streamed = DPOTrainer(tiny(tokenizer), args=stream_args, train_dataset=long_prompt_pairs().to_iterable_dataset(),
                          processing_class=tokenizer)  # fmt: skip
    assert [row["prompt_ids"] for row in streamed.train_dataset] == [trainer.train_dataset[0]["prompt_ids"]]


def test_keep_end_and_no_max_length_keep_every_pair(tokenizer, tmp_path):
    for overrides in ({"max_length": 6, "truncation_mode": "keep_end"}, {"max_length": None}):
        trainer = DPOTrainer(tiny(tokenizer), args=dpo_args(tmp_path, **overrides), train_dataset=long_prompt_pairs(),
                             processing_class=tokenizer)  # fmt: skip
        assert len(trainer.train_dataset) == 2


def test_every_pair_fully_truncated_is_refused(tokenizer, tmp_path):
    args = dpo_args(tmp_path, max_length=2, truncation_mode="keep_start")
    with pytest.raises(ValueError, match=r"every pair of train_dataset has a prompt of max_length=2 tokens or more"):
        DPOTrainer(tiny(tokenizer), args=args, train_dataset=long_prompt_pairs(), processing_class=tokenizer)
