"""Streaming (`IterableDataset`) pairs in the reward trainer, as TRL accepts them: the map-style update, pairs
longer than max_length dropped on the fly, max_steps required."""

import pytest
import torch
from datasets import Dataset

from replayrl.reward import RewardTrainer
from tests.reward.test_trainer import classifier, pairs_data, rm_args  # noqa: F401 (pairs_data: a fixture)


def _flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_streaming_pairs_give_the_map_style_update(tokenizer, pairs_data, tmp_path):  # noqa: F811
    pairs = pairs_data[0].select(range(8))
    runs = []
    for name, data in (("map", pairs), ("stream", pairs.to_iterable_dataset())):
        args = rm_args(tmp_path / name, per_device_train_batch_size=8, optim="sgd", learning_rate=1.0)
        trainer = RewardTrainer(classifier(tokenizer), args=args, train_dataset=data, processing_class=tokenizer)
        trainer.train()
        runs.append((trainer.state.log_history[0]["loss"], _flat(trainer.model)))
    assert runs[1][0] == pytest.approx(runs[0][0], abs=1e-6)
    assert torch.allclose(runs[1][1], runs[0][1], atol=1e-5)
    assert not torch.equal(runs[0][1], _flat(classifier(tokenizer)))


def test_streaming_drops_long_pairs_and_needs_max_steps(tokenizer, pairs_data, tmp_path):  # noqa: F811
    stream = pairs_data[0].to_iterable_dataset()
    with pytest.raises(ValueError, match="max_steps must be set"):
        RewardTrainer(classifier(tokenizer), args=rm_args(tmp_path, max_steps=-1), train_dataset=stream,
                      processing_class=tokenizer)  # fmt: skip
    full = RewardTrainer(classifier(tokenizer), args=rm_args(tmp_path, max_length=None), train_dataset=pairs_data[0],
                         processing_class=tokenizer).train_dataset  # fmt: skip
    longest = sorted(max(len(c), len(r)) for c, r in zip(full["chosen_ids"], full["rejected_ids"]))
    limit = longest[-1] - 1  # the longest pairs are dropped, the others kept
    args = rm_args(tmp_path, max_length=limit)
    trainer = RewardTrainer(classifier(tokenizer), args=args, train_dataset=stream, processing_class=tokenizer)
    rows = list(trainer.train_dataset)
    expected = RewardTrainer(classifier(tokenizer), args=args, train_dataset=pairs_data[0], processing_class=tokenizer)
    assert len(rows) == len(expected.train_dataset) < len(pairs_data[0])  # some pairs were too long
    assert all(len(r["chosen_ids"]) <= limit and len(r["rejected_ids"]) <= limit for r in rows)


def test_streaming_v071_pretokenized_columns_are_renamed(tokenizer, tmp_path):
    enc = lambda text: tokenizer(text).input_ids  # noqa: E731
    rows = [(f"{a}+1={a + 1}", f"{a}+1={a + 2}") for a in range(8)]
    data = Dataset.from_dict(
        {
            "input_ids_chosen": [enc(c) + [tokenizer.pad_token_id] for c, _ in rows],
            "attention_mask_chosen": [[1] * len(enc(c)) + [0] for c, _ in rows],
            "input_ids_rejected": [enc(r) for _, r in rows],
        }
    )
    trainer = RewardTrainer(classifier(tokenizer), args=rm_args(tmp_path, max_steps=1),
                            train_dataset=data.to_iterable_dataset(), processing_class=tokenizer)  # fmt: skip
    row = next(iter(trainer.train_dataset))
    assert set(row) == {"chosen_ids", "rejected_ids"} and row["chosen_ids"] == enc(rows[0][0])
    trainer.train()
