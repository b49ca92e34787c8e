"""RewardTrainer through train(): learning, the loss on a real batch, seed columns, pad-token check, bad input."""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from transformers import EvalPrediction

from replayrl.metrics import METRICS_FILE, read_metrics
from replayrl.models.tiny import build_tiny_sequence_classifier
from replayrl.reward import RewardConfig, RewardTrainer, compute_accuracy
from replayrl.tasks.preferences import preference_datasets
from tests.conftest import assert_same_updates

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


def classifier(tokenizer, seed=0):
    return build_tiny_sequence_classifier(tokenizer, seed=seed, **SMALL)


def rm_args(tmp_path, **overrides):
    kwargs = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=16,
        per_device_eval_batch_size=32,
        max_steps=1,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    kwargs.update(overrides)
    return RewardConfig(**kwargs)


@pytest.fixture(scope="module")
def pairs_data():
    return preference_datasets(seed=0, per_problem=2, rejected="near_miss")


def test_accuracy_rises_on_the_training_pairs(tokenizer, pairs_data, tmp_path):
    train = pairs_data[0].select(range(32))
    args = rm_args(tmp_path, max_steps=80, logging_steps=20, learning_rate=1e-2)
    trainer = RewardTrainer(classifier(tokenizer), args=args, train_dataset=train, processing_class=tokenizer)
    trainer.train()
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert logs[-1]["accuracy"] >= logs[0]["accuracy"] + 0.1
    assert logs[-1]["loss"] < logs[0]["loss"] - 0.2
    assert logs[-1]["margin"] > logs[0]["margin"]
    assert logs[-1]["num_tokens"] > logs[0]["num_tokens"] > 0
    assert read_metrics(tmp_path / "out" / METRICS_FILE)[0]["accuracy"] == logs[0]["accuracy"]
    result = trainer.evaluate(pairs_data[0].select(range(32)))  # compute_accuracy over the whole set
    assert result["eval_accuracy"] >= 0.8


def test_loss_is_bradley_terry_at_the_last_real_token(tokenizer, tmp_path):
    """The first logged loss equals -log sigmoid(r_c - r_r - margin), with r read by hand at the last token of
    each unpadded sequence (so padding cannot move the read position)."""
    data = Dataset.from_dict(
        {"prompt": ["1+1=", "22+3="], "chosen": ["2", "25"], "rejected": ["3 or so", "1"], "margin": [0.5, 0.0]}
    )
    model = classifier(tokenizer)
    trainer = RewardTrainer(model, args=rm_args(tmp_path), train_dataset=data, processing_class=tokenizer)
    rewards = []
    with torch.no_grad():
        for row in trainer.train_dataset:
            pair = []
            for side in ("chosen", "rejected"):
                ids = torch.tensor([row[f"{side}_ids"]])
                hidden = model.model(input_ids=ids).last_hidden_state
                pair.append(model.score(hidden)[0, -1, 0].item())
            rewards.append(pair)
    expected = np.mean([-F.logsigmoid(torch.tensor(c - r - m)).item() for (c, r), m in zip(rewards, [0.5, 0.0])])
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected, abs=1e-5)


def test_center_rewards_coefficient_adds_the_penalty(tokenizer, pairs_data, tmp_path):
    data = pairs_data[0].select(range(16))
    plain = RewardTrainer(classifier(tokenizer), args=rm_args(tmp_path / "a"), train_dataset=data,
                          processing_class=tokenizer)  # fmt: skip
    batch = plain._prepare_inputs(next(iter(plain.get_train_dataloader())))
    with torch.no_grad():
        c, r = plain.rewards(plain.model, batch)
    centred = RewardTrainer(classifier(tokenizer), args=rm_args(tmp_path / "b", center_rewards_coefficient=0.01),
                            train_dataset=data, processing_class=tokenizer)  # fmt: skip
    centred.train()
    expected = -F.logsigmoid(c - r).mean().item() + 0.01 * ((c + r) ** 2).mean().item()
    assert centred.state.log_history[0]["loss"] == pytest.approx(expected, abs=1e-5)


def test_seed_pretokenized_columns(tokenizer, tmp_path):
    """TRL v0.7.1's pre-tokenized columns (+ masks) are renamed to TRL 1.16's `chosen_ids`/`rejected_ids`, the
    tokens a mask leaves out dropped, and train to the same loss as the same tokens under TRL 1.16's names."""
    enc = lambda text: tokenizer(text).input_ids  # noqa: E731
    rows = [(f"{a}+1={a + 1}", f"{a}+1={a + 2}") for a in range(8)]
    pad = tokenizer.pad_token_id
    data = Dataset.from_dict(
        {
            "input_ids_chosen": [enc(c) + [pad] for c, _ in rows],  # a padded token, masked out
            "attention_mask_chosen": [[1] * len(enc(c)) + [0] for c, _ in rows],
            "input_ids_rejected": [enc(r) for _, r in rows],
            "attention_mask_rejected": [[1] * len(enc(r)) for _, r in rows],
        }
    )
    new = Dataset.from_dict({"chosen_ids": [enc(c) for c, _ in rows], "rejected_ids": [enc(r) for _, r in rows]})
    runs = []
    for dataset in (data, new):
        trainer = RewardTrainer(classifier(tokenizer), args=rm_args(tmp_path, max_steps=2), train_dataset=dataset,
                                tokenizer=tokenizer, max_length=64)  # fmt: skip
        assert trainer.args.max_length == 64
        assert trainer.train_dataset.column_names == ["chosen_ids", "rejected_ids"]
        assert trainer.train_dataset[0]["chosen_ids"] == enc(rows[0][0])
        trainer.train()
        runs.append(trainer.state.log_history[0]["loss"])
    assert math.isfinite(runs[0]) and runs[0] == pytest.approx(runs[1], abs=1e-6)


def test_pad_token_is_set_from_the_tokenizer_or_refused(tokenizer, pairs_data, tmp_path):
    model = classifier(tokenizer)
    model.config.pad_token_id = None
    trainer = RewardTrainer(model, args=rm_args(tmp_path), train_dataset=pairs_data[0], processing_class=tokenizer)
    assert trainer.model.config.pad_token_id == tokenizer.pad_token_id
    model = classifier(tokenizer)
    model.config.pad_token_id = None
    with pytest.raises(ValueError, match="pad_token_id is not set"):
        RewardTrainer(
            model, args=rm_args(tmp_path), train_dataset=pairs_data[0].select(range(2)), processing_class=None
        )


def test_compute_accuracy_counts_ties_as_wrong():
    preds = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 2.0], [3.0, 1.0]])
    assert compute_accuracy(EvalPrediction(predictions=preds, label_ids=np.zeros(4))) == {"accuracy": 0.5}


def test_bad_input(tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"not a preference dataset: it has columns \['text'\]"):
        RewardTrainer(classifier(tokenizer), args=rm_args(tmp_path), train_dataset=Dataset.from_dict({"text": ["a"]}),
                      processing_class=tokenizer)  # fmt: skip
    long = Dataset.from_dict({"prompt": ["1+1="], "chosen": ["2" * 50], "rejected": ["3"]})
    with pytest.raises(ValueError, match="longer than max_length=8"):
        RewardTrainer(classifier(tokenizer), args=rm_args(tmp_path, max_length=8), train_dataset=long,
                      processing_class=tokenizer)  # fmt: skip
    with pytest.raises(ValueError, match="center_rewards_coefficient"):
        rm_args(tmp_path, center_rewards_coefficient=-1.0)


def test_peft_reward_model_trains_the_adapter_and_head(tokenizer, pairs_data, tmp_path):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS",
                             modules_to_save=["score"])  # fmt: skip
    trainer = RewardTrainer(classifier(tokenizer), args=rm_args(tmp_path, max_steps=3), peft_config=config,
                            train_dataset=pairs_data[0].select(range(16)), processing_class=tokenizer)  # fmt: skip
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert any("lora_" in n for n in before) and any("score" in n for n in before)
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if n in before and not torch.equal(p, before[n])]
    assert any("lora_B" in n for n in changed) and any("score" in n for n in changed)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_prefix_sharing_gives_the_two_row_losses_and_updates(tokenizer, tmp_path, attn, pad_is_eos):
    """One prefix-shared row per pair vs two rows: the same losses, accuracies and trained weights over three
    steps, from fewer tokens. With pad == EOS (appended), transformers' pooling reads the token before the EOS;
    the shared rows must read the same one."""
    rows = [{"prompt": "q" * (2 + 3 * i), "chosen": "ab"[i % 2] * (1 + i % 3), "rejected": "ac" + "d" * (i % 2)}
            for i in range(8)]  # fmt: skip

    tok = copy.deepcopy(tokenizer)
    if pad_is_eos:
        tok.pad_token = tok.eos_token

    def run(sharing):
        model = classifier(tok)
        model.config._attn_implementation = attn
        args = rm_args(tmp_path / str(sharing), max_steps=3, per_device_train_batch_size=8, prefix_sharing=sharing,
                       append_eos=pad_is_eos, center_rewards_coefficient=0.01)  # fmt: skip
        trainer = RewardTrainer(model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
        assert trainer.pad_token_id == (tok.eos_token_id if pad_is_eos else tok.pad_token_id)
        shapes = []
        model.model.embed_tokens.register_forward_hook(lambda m, inputs, out: shapes.append(tuple(inputs[0].shape)))
        trainer.train()
        logged = [r for r in trainer.state.log_history if "loss" in r]
        return logged, [p.detach().clone() for p in model.parameters()], shapes

    (base, base_weights, base_shapes), (shared, weights, shapes) = run(False), run(True)
    for a, b in zip(base, shared):
        for key in ("loss", "accuracy", "margin", "rewards/mean"):
            assert b[key] == pytest.approx(a[key], abs=1e-5), key
    for w, v in zip(base_weights, weights):
        torch.testing.assert_close(v, w, atol=2e-5, rtol=1e-4)
    assert [s[0] for s in base_shapes] == [16] * 3 and all(s[0] <= 8 for s in shapes)
    assert sum(math.prod(s) for s in shapes) < 0.8 * sum(math.prod(s) for s in base_shapes)


def test_gradient_accumulation_8x1_equals_1x8(tokenizer, pairs_data, tmp_path):
    """replayrl scales the loss itself (replayrl.accumulation): the same SGD update on any transformers version."""
    train = pairs_data[0].select(range(8))
    results = []
    for bs, ga in [(8, 1), (1, 8), (2, 4)]:
        args = rm_args(tmp_path / f"{bs}x{ga}", per_device_train_batch_size=bs, gradient_accumulation_steps=ga,
                       optim="sgd", learning_rate=1.0, max_grad_norm=0.0)  # fmt: skip
        trainer = RewardTrainer(classifier(tokenizer), args=args, train_dataset=train, processing_class=tokenizer)
        trainer.train()
        loss = next(r["loss"] for r in trainer.state.log_history if "loss" in r)
        results.append((loss, [p.detach().clone() for p in trainer.model.parameters()]))
    assert_same_updates(results, list(classifier(tokenizer).parameters()))


def test_num_tokens_goes_on_after_a_resume(tokenizer, pairs_data, tmp_path):
    """num_tokens is a running total: a run resumed from checkpoint-2 logs the uninterrupted run's values (it
    restarted from 0 before the count was part of the checkpoint)."""
    train = pairs_data[0].select(range(16))

    def run(out, resume=None):
        args = rm_args(tmp_path, output_dir=str(tmp_path / out), per_device_train_batch_size=4, max_steps=3,
                       save_strategy="steps", save_steps=2)  # fmt: skip
        trainer = RewardTrainer(classifier(tokenizer), args=args, train_dataset=train, processing_class=tokenizer)
        trainer.train(resume_from_checkpoint=resume)
        return [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]

    straight = run("straight")
    assert run("resumed", resume=str(tmp_path / "straight" / "checkpoint-2")) == straight
