"""As TRL 1.16: SFT, DPO, reward and KTO refuse a missing train_dataset and a DatasetDict, before loading anything
(the model is given by a path that does not exist: the check must come first)."""

import pytest
from datasets import Dataset, DatasetDict

from replayrl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer, RewardConfig, RewardTrainer, SFTConfig, SFTTrainer

TRAINERS = {
    "sft": (SFTTrainer, SFTConfig, {"text": ["a b"]}),
    "dpo": (DPOTrainer, DPOConfig, {"prompt": ["q"], "chosen": [" a"], "rejected": [" b"]}),
    "reward": (RewardTrainer, RewardConfig, {"chosen": ["q a"], "rejected": ["q b"]}),
    "kto": (KTOTrainer, KTOConfig, {"prompt": ["q"], "completion": [" a"], "label": [True]}),
}


@pytest.mark.parametrize("name", list(TRAINERS))
def test_missing_train_dataset_and_dataset_dict_are_refused_first(name, tmp_path):
    trainer_cls, config_cls, columns = TRAINERS[name]
    args = config_cls(output_dir=str(tmp_path), report_to="none")
    model = str(tmp_path / "no-such-model")
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        trainer_cls(model, args=args, train_dataset=None)
    splits = DatasetDict({"train": Dataset.from_dict(columns)})
    with pytest.raises(TypeError, match=r"must be a `Dataset` or `IterableDataset`, got `DatasetDict`.*\['train'\]"):
        trainer_cls(model, args=args, train_dataset=splits)
