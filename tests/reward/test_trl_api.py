"""TRL 1.16 API points of the reward trainer that TRL's own test file checks: its collator, the num_labels error,
the model's tags, evaluation over named eval datasets, and TRL 1.16's pre-tokenized columns."""

import copy
import math

import pytest
import torch
from datasets import Dataset

from replayrl.models.tiny import build_tiny_sequence_classifier
from replayrl.reward import DataCollatorForPreference, RewardTrainer
from replayrl.tasks.preferences import preference_datasets
from tests.reward.test_trainer import SMALL, rm_args


def test_data_collator_for_preference_pads_chosen_then_rejected():
    collator = DataCollatorForPreference(pad_token_id=9, pad_to_multiple_of=4)
    batch = collator(
        [
            {"chosen_ids": [1, 2, 3], "rejected_ids": [4], "margin": 0.5},
            {"chosen_ids": [5], "rejected_ids": [6, 7], "margin": 1},
        ]
    )
    assert batch["input_ids"].tolist() == [[1, 2, 3, 9], [5, 9, 9, 9], [4, 9, 9, 9], [6, 7, 9, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]]
    torch.testing.assert_close(batch["margin"], torch.tensor([0.5, 1.0]))
    assert "margin" not in DataCollatorForPreference(0)([{"chosen_ids": [1], "rejected_ids": [2]}])


def test_num_labels_other_than_one_is_refused_in_trl_words(tokenizer, tmp_path):
    model = build_tiny_sequence_classifier(tokenizer, seed=0, **SMALL)
    model.config.num_labels = 2
    train = preference_datasets(seed=0, per_problem=1)[0].select(range(4))
    with pytest.raises(ValueError, match=r"reward models require `num_labels=1` \(got 2\)"):
        RewardTrainer(model, args=rm_args(tmp_path), train_dataset=train, processing_class=tokenizer)


def test_model_tags_and_named_eval_datasets(tokenizer, tmp_path):
    train, test = preference_datasets(seed=0, per_problem=1)[:2]
    args = rm_args(tmp_path, max_steps=2, eval_strategy="steps", eval_steps=2)
    model = build_tiny_sequence_classifier(tokenizer, seed=0, **SMALL)
    trainer = RewardTrainer(
        model,
        args=args,
        train_dataset=train.select(range(16)),
        eval_dataset={"a": test.select(range(4)), "b": test.select(range(4, 8))},
        processing_class=tokenizer,
    )
    assert {"trl", "reward-trainer"} <= set(trainer.model.model_tags)
    trainer.train()
    logged = {k for row in trainer.state.log_history for k in row}
    assert {"eval_a_loss", "eval_b_loss"} <= logged


@pytest.mark.parametrize(
    "chosen, rejected", [("chosen_ids", "rejected_ids"), ("chosen_input_ids", "rejected_input_ids")]
)
def test_trl_pretokenized_columns_train(tokenizer, tmp_path, chosen, rejected):
    rows = [(f"{a}+1={a + 1}", f"{a}+1={a + 2}") for a in range(8)]
    data = Dataset.from_dict(
        {chosen: [tokenizer(c).input_ids for c, _ in rows], rejected: [tokenizer(r).input_ids for _, r in rows]}
    )
    model = build_tiny_sequence_classifier(tokenizer, seed=0, **SMALL)
    args = rm_args(tmp_path, max_steps=1)
    if chosen == "chosen_ids":
        trainer = RewardTrainer(model, args=args, train_dataset=data, processing_class=tokenizer)
    else:
        with pytest.warns(FutureWarning, match="will not be supported in v1"):
            trainer = RewardTrainer(model, args=args, train_dataset=data, processing_class=tokenizer)
    assert trainer.train_dataset.column_names == ["chosen_ids", "rejected_ids"]  # TRL 1.16's names, as TRL's test
    assert trainer.train_dataset[0]["chosen_ids"] == data[0][chosen]
    trainer.train()
    assert math.isfinite(trainer.state.log_history[0]["loss"])


def test_prepared_dataset_keeps_the_rows_and_adds_trls_ids(tokenizer, tmp_path):
    """TRL 1.16's prepared reward layout: the rows' own columns, plus `chosen_ids`/`rejected_ids` (no masks)."""
    rows = Dataset.from_dict({"prompt": ["1+1="] * 4, "chosen": ["2"] * 4, "rejected": ["3"] * 4, "margin": [0.5] * 4})
    model = build_tiny_sequence_classifier(tokenizer, seed=0, **SMALL)
    trainer = RewardTrainer(model, args=rm_args(tmp_path, max_steps=1), train_dataset=rows, processing_class=tokenizer)
    assert trainer.train_dataset.column_names == [
        "prompt",
        "chosen",
        "rejected",
        "margin",
        "chosen_ids",
        "rejected_ids",
    ]
    assert tokenizer.decode(trainer.train_dataset[0]["chosen_ids"]) == "1+1=2"
    trainer.train()


def test_row_chat_template_kwargs_reach_the_template(tokenizer, tmp_path):
    """As TRL 1.16 (its test_train_with_chat_template_kwargs): a row's `chat_template_kwargs` go to the template."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] | upper if shout else m['role'] }}]{{ m['content'] }}{% endfor %}"
    )
    turns = lambda reply: [{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply}]  # noqa: E731
    rows = Dataset.from_list(
        [
            {"chosen": turns("yes"), "rejected": turns("no"), "chat_template_kwargs": {"shout": bool(i % 2)}}
            for i in range(4)
        ]
    )
    model = build_tiny_sequence_classifier(tok, seed=0, **SMALL)
    trainer = RewardTrainer(model, args=rm_args(tmp_path, max_steps=1), train_dataset=rows, processing_class=tok)
    assert tok.decode(trainer.train_dataset[0]["chosen_ids"]) == "[user]hi[assistant]yes"
    assert tok.decode(trainer.train_dataset[1]["rejected_ids"]) == "[USER]hi[ASSISTANT]no"
    trainer.train()


def test_trls_collator_as_data_collator_trains_the_same(tokenizer, tmp_path):
    """TRL 1.16's `DataCollatorForPreference` (chosen rows then rejected rows) given as `data_collator` reads the
    prepared columns and trains to the same losses as the default collator."""
    train, _ = preference_datasets(seed=0, per_problem=1)
    runs = []
    for collator in (None, DataCollatorForPreference(tokenizer.pad_token_id)):
        model = build_tiny_sequence_classifier(tokenizer, seed=0, **SMALL)
        trainer = RewardTrainer(model, args=rm_args(tmp_path, max_steps=3), data_collator=collator,
                                train_dataset=train.select(range(48)), processing_class=tokenizer)  # fmt: skip
        trainer.train()
        runs.append([row["loss"] for row in trainer.state.log_history if "loss" in row])
    assert len(runs[0]) == 3 and len(set(runs[0])) > 1
    assert runs[1] == pytest.approx(runs[0], abs=1e-6)
