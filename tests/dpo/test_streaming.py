"""Streaming (`IterableDataset`) preference data in DPO, as TRL accepts it: the same update as the map-style
dataset, max_steps required, precomputed reference log-probs refused."""

import pytest
import torch

from replayrl import DPOTrainer
from tests.dpo.test_trainer import dpo_args, losses, pairs_data, tiny  # noqa: F401 (pairs_data: a fixture)


def test_streaming_pairs_give_the_map_style_update(tokenizer, pairs_data, tmp_path):  # noqa: F811
    pairs = pairs_data[0].select(range(8))  # one batch of 8: the order inside it does not change the update
    runs = []
    for name, data in (("map", pairs), ("stream", pairs.to_iterable_dataset())):
        args = dpo_args(tmp_path / name, max_steps=1, optim="sgd", learning_rate=1.0)  # SGD: update = -gradient
        trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=data, processing_class=tokenizer)
        trainer.train()
        runs.append((losses(trainer)[0], torch.cat([p.detach().flatten() for p in trainer.model.parameters()])))
    (loss_map, params_map), (loss_stream, params_stream) = runs
    assert loss_stream == pytest.approx(loss_map, abs=1e-6)
    assert torch.allclose(params_stream, params_map, atol=1e-5)
    assert not torch.equal(params_map, torch.cat([p.flatten() for p in tiny(tokenizer).parameters()]))


def test_streaming_needs_max_steps_and_no_precompute(tokenizer, pairs_data, tmp_path):  # noqa: F811
    stream = pairs_data[0].to_iterable_dataset()
    with pytest.raises(ValueError, match="max_steps must be set"):
        DPOTrainer(
            tiny(tokenizer), args=dpo_args(tmp_path, max_steps=-1), train_dataset=stream, processing_class=tokenizer
        )
    with pytest.raises(ValueError, match="precompute_ref_log_probs=True"):
        args = dpo_args(tmp_path, precompute_ref_log_probs=True)
        DPOTrainer(tiny(tokenizer), args=args, train_dataset=stream, processing_class=tokenizer)
