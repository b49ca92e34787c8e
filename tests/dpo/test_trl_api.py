"""TRL 1.16 API points of DPO that TRL's own test file checks: `aot_unpaired`, precomputed reference log-probs
with streaming or several eval datasets, and TRL's error wording."""

import math

import pytest
import torch
from datasets import IterableDatasetDict

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
