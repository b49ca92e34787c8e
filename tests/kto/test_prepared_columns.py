"""TRL 1.16's prepared KTO layout: `trainer.train_dataset` / `eval_dataset` carry `prompt_ids`, `completion_ids`,
`label` (+ the rows' own columns, pairs unpaired into `prompt`/`completion`/`label`); a dataset already in that
layout trains as the same data given as text; replayrl's earlier `prompt_input_ids`/`completion_input_ids` still
train, renamed."""

import copy

import pytest
import torch
from datasets import Dataset

from replayrl.kto import DataCollatorForUnpairedPreference, KTOTrainer
from replayrl.models.tiny import build_tiny_model
from replayrl.tasks.preferences import preference_datasets
from tests.kto.test_trainer import kto_args

IDS = ["prompt_ids", "completion_ids"]
OLD = ["prompt_input_ids", "completion_input_ids"]


def tiny(tokenizer, seed=0):
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=seed)


def unpaired(per_problem=1) -> Dataset:
    """The addition preferences as unpaired rows, chosen and rejected alternating, with an extra `source` column."""
    pairs = preference_datasets(0, per_problem=per_problem)[0]
    rows = {"prompt": [], "completion": [], "label": [], "source": []}
    for row in pairs:
        for side, label in (("chosen", True), ("rejected", False)):
            rows["prompt"].append(row["prompt"])
            rows["completion"].append(row[side])
            rows["label"].append(label)
            rows["source"].append(f"addition/{side}")
    return Dataset.from_dict(rows)


def pretokenized(rows: Dataset, tokenizer, names=IDS) -> Dataset:
    """The rows tokenized by hand as TRL 1.16 lays them out: the prompt, the completion + EOS, the label."""
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt, completion = names
    return Dataset.from_dict({
        prompt: [enc(p) for p in rows["prompt"]],
        completion: [enc(c) + [tokenizer.eos_token_id] for c in rows["completion"]],
        "label": list(rows["label"]),
    })  # fmt: skip


def test_prepared_datasets_carry_trls_columns(tokenizer, tmp_path):
    """Unpaired rows keep their own columns; pairs are unpaired into prompt/completion/label; evaluate() prepares
    a dataset passed to it the same way; a streaming dataset (text, or replayrl's old names) is prepared lazily."""
    rows, pairs = unpaired(), preference_datasets(0, per_problem=1)[1].select(range(4))
    trainer = KTOTrainer(tiny(tokenizer), args=kto_args(tmp_path, max_steps=1), train_dataset=rows,
                         eval_dataset={"a": rows.select(range(4)), "b": pairs}, processing_class=tokenizer)  # fmt: skip
    for dataset in (trainer.train_dataset, trainer.eval_dataset["a"], trainer.eval_dataset["b"]):
        columns = set(dataset.column_names)
        assert {*IDS, "prompt", "completion", "label"} <= columns
        assert not set(OLD) & columns and "attention_mask" not in columns
    assert "source" in trainer.train_dataset.column_names
    assert trainer.eval_dataset["b"]["label"] == [True, False] * 4
    row = trainer.train_dataset[0]
    assert (row["prompt"], row["completion"], row["label"]) == (rows[0]["prompt"], rows[0]["completion"], True)
    assert tokenizer.decode(row["prompt_ids"]) == rows[0]["prompt"]
    assert tokenizer.decode(row["completion_ids"]) == rows[0]["completion"] + tokenizer.eos_token
    trainer.train()
    assert trainer.evaluate(pairs)["eval_loss"] > 0
    streamed = KTOTrainer(tiny(tokenizer), args=kto_args(tmp_path, max_steps=1), processing_class=tokenizer,
                          train_dataset=rows.to_iterable_dataset())  # fmt: skip
    assert next(iter(streamed.train_dataset))["prompt_ids"] == row["prompt_ids"]
    streamed.train()
    assert streamed.state.global_step == 1
    old = pretokenized(rows, tokenizer, OLD).to_iterable_dataset()  # old names, streamed: renamed lazily
    streamed = KTOTrainer(tiny(tokenizer), args=kto_args(tmp_path, max_steps=1), processing_class=tokenizer,
                          train_dataset=old)  # fmt: skip
    assert set(next(iter(streamed.train_dataset))) == {*IDS, "label"}
    streamed.train()
    assert streamed.state.global_step == 1


@pytest.mark.parametrize("overrides", [{}, {"max_length": 6}])
@pytest.mark.parametrize("names", [IDS, OLD], ids=["trl_1_16", "replayrl_old"])
def test_pretokenized_rows_train_as_the_same_text(tokenizer, tmp_path, names, overrides):
    """The same rows, as text and pre-tokenized (TRL 1.16's names, or replayrl's earlier ones, renamed): the same
    prepared ids and the same losses, reference points, margins and weights over 3 steps, against a reference that
    differs from the policy (so the first loss depends on the data)."""
    rows = unpaired(per_problem=2)  # half the pairs get a longer prompt (8 tokens), for max_length to drop
    rows = rows.map(lambda row, i: {"prompt": "0+0+" * (i % 4 < 2) + row["prompt"]}, with_indices=True)
    args = kto_args(tmp_path, max_steps=3, per_device_train_batch_size=4, **overrides)
    runs = []
    for dataset in (rows, pretokenized(rows, tokenizer, names)):
        trainer = KTOTrainer(tiny(tokenizer), ref_model=tiny(tokenizer, seed=1), args=copy.deepcopy(args),
                             train_dataset=dataset, processing_class=tokenizer)  # fmt: skip
        columns = set(trainer.train_dataset.column_names)
        assert {*IDS, "label"} <= columns and not set(OLD) & columns
        prepared = [trainer.train_dataset[c] for c in [*IDS, "label"]]
        trainer.train()
        logs = [h[k] for h in trainer.state.log_history if "loss" in h for k in ("loss", "kl", "rewards/margins")]
        runs.append((prepared, logs, torch.cat([p.detach().flatten() for p in trainer.model.parameters()])))
    (text_ids, text_logs, text_weights), (ids, got_logs, weights) = runs
    assert ids == text_ids
    if overrides:  # rows whose prompt fills max_length are dropped on both paths
        assert 0 < len(ids[0]) < len(rows) and max(len(p) for p in ids[0]) == 4
    assert len(got_logs) == 9 and len(set(text_logs[::3])) > 1
    assert got_logs == pytest.approx(text_logs, abs=1e-6)
    torch.testing.assert_close(weights, text_weights, atol=1e-6, rtol=1e-6)


def test_a_trl_prepared_dataset_trains_with_trls_collator(tokenizer, tmp_path):
    """Rows as TRL 1.16's KTOTrainer prepares them (the text columns, `prompt_ids`, `completion_ids`, `label` and
    `KL_completion_ids`, each batch's completions rotated by one), kept whole (`remove_unused_columns=False`) and
    batched by TRL's collator: the same losses and weights as the text with the default collator (replayrl builds
    its own mismatched pairs; the `KL_*` tensors are carried, not read)."""
    rows = unpaired(per_problem=2)
    args = kto_args(tmp_path, max_steps=3, per_device_train_batch_size=4, remove_unused_columns=False)
    ids = pretokenized(rows, tokenizer)
    completions = ids["completion_ids"]
    kl = [completions[i - 1 if i % 4 else i + 3] for i in range(len(completions))]  # TRL's rotation per batch of 4
    trl_prepared = ids.add_column("KL_completion_ids", kl)
    for column in ("prompt", "completion"):
        trl_prepared = trl_prepared.add_column(column, rows[column])
    runs = []
    for dataset, collator in (
        (rows, None),
        (trl_prepared, DataCollatorForUnpairedPreference(tokenizer.pad_token_id, args.max_length)),
    ):
        trainer = KTOTrainer(tiny(tokenizer), ref_model=tiny(tokenizer, seed=1), args=copy.deepcopy(args),
                             data_collator=collator, train_dataset=dataset, processing_class=tokenizer)  # fmt: skip
        batch = next(iter(trainer.get_train_dataloader()))
        trainer.train()
        logs = [h[k] for h in trainer.state.log_history if "loss" in h for k in ("loss", "kl", "rewards/margins")]
        runs.append((batch, logs, torch.cat([p.detach().flatten() for p in trainer.model.parameters()])))
    (_, text_logs, text_weights), (batch, got_logs, weights) = runs
    assert batch["KL_input_ids"].shape[0] == 4 and len(got_logs) == 9
    assert got_logs == pytest.approx(text_logs, abs=1e-6)
    torch.testing.assert_close(weights, text_weights, atol=1e-6, rtol=1e-6)
