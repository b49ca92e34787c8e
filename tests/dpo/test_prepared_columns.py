"""TRL 1.16's prepared DPO layout: `trainer.train_dataset` / `eval_dataset` carry `prompt_ids`, `chosen_ids`,
`rejected_ids` (+ the rows' own columns, + `ref_chosen_logps` / `ref_rejected_logps` when precomputed); a dataset
already in that layout trains as the same data given as text; TRL v0.7.1's `prompt_input_ids`/`chosen_input_ids`/
`rejected_input_ids` still train, renamed."""

import copy

import pytest
import torch
from datasets import Dataset

from replayrl.dpo import DataCollatorForPreference, DPOTrainer
from tests.dpo.test_trainer import dpo_args, losses, pairs_data, tiny  # noqa: F401

IDS = ["prompt_ids", "chosen_ids", "rejected_ids"]
OLD = ["prompt_input_ids", "chosen_input_ids", "rejected_input_ids"]


def pretokenized(rows: Dataset, tokenizer, names=IDS) -> Dataset:
    """The pairs tokenized by hand as TRL 1.16 lays them out: the prompt, and each completion + EOS."""
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = [tokenizer.eos_token_id]
    prompt, chosen, rejected = names
    return Dataset.from_dict(
        {
            prompt: [enc(p) for p in rows["prompt"]],
            chosen: [enc(c) + eos for c in rows["chosen"]],
            rejected: [enc(r) + eos for r in rows["rejected"]],
        }
    )


def test_prepared_datasets_carry_trls_columns(tokenizer, pairs_data, tmp_path):  # noqa: F811
    train, held_out = pairs_data[0], pairs_data[1].select(range(4))
    args = dpo_args(tmp_path, precompute_ref_log_probs=True)
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=train, eval_dataset={"a": held_out, "b": held_out},
                         processing_class=tokenizer)  # fmt: skip
    for dataset in (trainer.train_dataset, trainer.eval_dataset["a"], trainer.eval_dataset["b"]):
        columns = dataset.column_names
        assert set(IDS + ["prompt", "chosen", "rejected", "ref_chosen_logps", "ref_rejected_logps"]) <= set(columns)
        assert not set(OLD) & set(columns) and "input_ids_chosen" not in columns
    row = trainer.train_dataset[0]
    assert tokenizer.decode(row["prompt_ids"]) == train[0]["prompt"]
    assert tokenizer.decode(row["chosen_ids"]) == train[0]["chosen"] + tokenizer.eos_token
    streamed = DPOTrainer(tiny(tokenizer), args=dpo_args(tmp_path, max_steps=1), processing_class=tokenizer,
                          train_dataset=train.to_iterable_dataset())  # fmt: skip
    assert next(iter(streamed.train_dataset))["prompt_ids"] == row["prompt_ids"]


def test_implicit_prompt_is_split_into_the_prepared_columns(tokenizer, tmp_path):
    rows = Dataset.from_dict({"chosen": ["3+4=7", "1+1=2"], "rejected": ["3+4=8", "1+1=3"]})
    trainer = DPOTrainer(tiny(tokenizer), args=dpo_args(tmp_path), train_dataset=rows, processing_class=tokenizer)
    row = trainer.train_dataset[0]
    assert (row["prompt"], row["chosen"], row["rejected"]) == ("3+4=", "7", "8")  # as TRL's extract_prompt
    assert tokenizer.decode(row["prompt_ids"]) == "3+4="


@pytest.mark.parametrize("overrides", [{}, {"max_prompt_length": 4, "max_completion_length": 2}])
@pytest.mark.parametrize("names", [IDS, OLD], ids=["trl_1_16", "trl_0_7_1"])
def test_pretokenized_pairs_train_as_the_same_text(tokenizer, pairs_data, tmp_path, names, overrides):  # noqa: F811
    """The same pairs, as text and pre-tokenized (TRL 1.16's names, or TRL v0.7.1's renamed): the same prepared
    ids and the same losses and weights over 3 steps, against a reference that differs from the policy (so the
    first loss depends on the data)."""
    train = pairs_data[0]
    args = dpo_args(tmp_path, max_steps=3, per_device_train_batch_size=4, **overrides)
    runs = []
    for dataset in (train, pretokenized(train, tokenizer, names)):
        trainer = DPOTrainer(tiny(tokenizer), ref_model=tiny(tokenizer, seed=1), args=copy.deepcopy(args),
                             train_dataset=dataset, processing_class=tokenizer)  # fmt: skip
        assert set(IDS) <= set(trainer.train_dataset.column_names)
        assert not set(OLD) & set(trainer.train_dataset.column_names)
        prepared = [trainer.train_dataset[c] for c in IDS]
        trainer.train()
        runs.append((prepared, losses(trainer), torch.cat([p.detach().flatten() for p in trainer.model.parameters()])))
    (text_ids, text_losses, text_weights), (ids, got_losses, weights) = runs
    assert ids == text_ids
    if overrides:
        assert max(len(p) for p in ids[0]) == 4 and max(len(c) for c in ids[1]) == 2  # cut as the text path cuts
    assert len(got_losses) == 3 and len(set(text_losses)) > 1
    assert got_losses == pytest.approx(text_losses, abs=1e-6)
    assert torch.allclose(weights, text_weights, atol=1e-6)


def test_pretokenized_pairs_evaluate_and_precompute(tokenizer, pairs_data, tmp_path):  # noqa: F811
    data = pretokenized(pairs_data[0], tokenizer)
    args = dpo_args(tmp_path, precompute_ref_log_probs=True)
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=data, eval_dataset=data.select(range(4)),
                         processing_class=tokenizer)  # fmt: skip
    assert trainer.train_dataset.column_names == IDS + ["ref_chosen_logps", "ref_rejected_logps"]
    trainer.train()
    assert "eval_loss" in trainer.evaluate()


def test_row_chat_template_kwargs_reach_the_template(tokenizer, tmp_path):
    """As TRL 1.16: a row's `chat_template_kwargs` are passed to the chat template for that row."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] | upper if shout else m['role'] }}]{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}[{{ 'ASSISTANT' if shout else 'assistant' }}]{% endif %}"
    )
    user = [{"role": "user", "content": "hi"}]
    rows = Dataset.from_list(
        [
            {"prompt": user, "chosen": [{"role": "assistant", "content": "yes"}],
             "rejected": [{"role": "assistant", "content": "no"}], "chat_template_kwargs": {"shout": bool(i % 2)}}
            for i in range(4)
        ]
    )  # fmt: skip
    trainer = DPOTrainer(tiny(tok), args=dpo_args(tmp_path), train_dataset=rows, processing_class=tok)
    assert tok.decode(trainer.train_dataset[0]["prompt_ids"]) == "[user]hi[assistant]"
    assert tok.decode(trainer.train_dataset[1]["prompt_ids"]) == "[USER]hi[ASSISTANT]"
    trainer.train()


@pytest.mark.parametrize("precompute", [False, True])
def test_trls_collator_as_data_collator_trains_the_same(tokenizer, pairs_data, tmp_path, precompute):  # noqa: F811
    """TRL 1.16's `DataCollatorForPreference` (chosen rows then rejected rows, `completion_mask`) given as
    `data_collator` reads the prepared columns and trains to the same losses and weights as the default collator."""
    args = dpo_args(tmp_path, max_steps=3, per_device_train_batch_size=4, precompute_ref_log_probs=precompute)
    runs = []
    for collator in (None, DataCollatorForPreference(tokenizer.pad_token_id)):
        trainer = DPOTrainer(tiny(tokenizer), ref_model=tiny(tokenizer, seed=1), args=copy.deepcopy(args),
                             data_collator=collator, train_dataset=pairs_data[0],
                             processing_class=tokenizer)  # fmt: skip
        trainer.train()
        runs.append((losses(trainer), torch.cat([p.detach().flatten() for p in trainer.model.parameters()])))
    assert len(runs[0][0]) == 3 and len(set(runs[0][0])) > 1
    assert runs[1][0] == pytest.approx(runs[0][0], abs=1e-6)
    assert torch.allclose(runs[1][1], runs[0][1], atol=1e-6)


def test_streaming_pretokenized_pairs_with_old_names(tokenizer, pairs_data, tmp_path):  # noqa: F811
    stream = pretokenized(pairs_data[0], tokenizer, OLD).to_iterable_dataset()
    trainer = DPOTrainer(tiny(tokenizer), args=dpo_args(tmp_path, max_steps=1, max_prompt_length=3),
                         train_dataset=stream, processing_class=tokenizer)  # fmt: skip
    row = next(iter(trainer.train_dataset))
    assert set(row) == set(IDS) and len(row["prompt_ids"]) <= 3
    trainer.train()
