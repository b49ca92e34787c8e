"""TRL 1.16's RewardConfig fields that replayrl's reward trainer gained late: each one checked through `train()`."""

import copy
import warnings

import pytest
import torch
from datasets import Dataset

from replayrl.reward import RewardConfig, RewardTrainer
from tests.reward.test_trainer import classifier, rm_args
from tests.trl_fields.parity import mismatches
from tests.trl_fields.probes import offloading_seen, save_remote_code_model

# TRL 1.16 defaults replayrl keeps different on purpose, with where that is documented.
DELIBERATE = {
    "bf16": "docs/reward.md and docs/deviations.md (Loading): transformers' False, so a CPU-first run trains in fp32",
    "gradient_checkpointing": "docs/reward.md: transformers' default kept (CPU-first, tiny models)",
}
ROWS = [{"prompt": "q" * (2 + 3 * i), "chosen": "ab"[i % 2] * (1 + i % 3), "rejected": "ac" + "d" * (i % 2)}
        for i in range(8)]  # fmt: skip


def test_every_trl_field_with_trl_defaults():
    assert mismatches(RewardConfig, "reward", DELIBERATE) == []


def run(tokenizer, tmp_path, name, **overrides):
    """3 steps on ROWS: the logged rows, the trained weights, the widths of the model's input rows."""
    model = classifier(tokenizer)
    args = rm_args(tmp_path / name, max_steps=3, per_device_train_batch_size=8, **overrides)
    trainer = RewardTrainer(model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tokenizer)
    shapes = []
    model.model.embed_tokens.register_forward_hook(lambda m, inputs, out: shapes.append(tuple(inputs[0].shape)))
    trainer.train()
    logged = [r for r in trainer.state.log_history if "loss" in r]
    return logged, [p.detach().clone() for p in model.parameters()], shapes


def assert_same_runs(a, b, atol=1e-5):
    for x, y in zip(a[0], b[0]):
        for key in ("loss", "accuracy", "margin", "rewards/mean"):
            assert y[key] == pytest.approx(x[key], abs=atol), key
    for w, v in zip(a[1], b[1]):
        torch.testing.assert_close(v, w, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("sharing", [False, True])
def test_pad_to_multiple_of_pads_the_trained_batch_and_keeps_the_loss(tokenizer, tmp_path, sharing):
    plain = run(tokenizer, tmp_path, "plain", prefix_sharing=sharing)
    padded = run(tokenizer, tmp_path, "padded", prefix_sharing=sharing, pad_to_multiple_of=8)
    assert any(s[1] % 8 for s in plain[2]) and all(s[1] % 8 == 0 for s in padded[2])
    assert_same_runs(plain, padded)


def test_pad_to_multiple_of_auto():
    assert RewardConfig(output_dir="x").pad_to_multiple_of is None  # "auto": 128 on Neuron only
    assert RewardConfig(output_dir="x", pad_to_multiple_of="8").pad_to_multiple_of == 8


@pytest.mark.parametrize("sharing", [False, True])
def test_activation_offloading_gives_the_same_steps(tokenizer, tmp_path, sharing):
    base = run(tokenizer, tmp_path, "on-device", prefix_sharing=sharing)
    offloaded = run(tokenizer, tmp_path, "offloaded", prefix_sharing=sharing, activation_offloading=True)
    assert_same_runs(base, offloaded, atol=1e-6)


def test_activation_offloading_wraps_the_training_forward(tokenizer, tmp_path):
    args = rm_args(tmp_path, activation_offloading=True)
    trainer = RewardTrainer(classifier(tokenizer), args=args, train_dataset=Dataset.from_list(ROWS),
                            processing_class=tokenizer)  # fmt: skip
    seen = offloading_seen(trainer)
    trainer.train()
    assert seen == [True]


def test_trust_remote_code_reaches_model_and_tokenizer_loading(tmp_path):
    path = save_remote_code_model(tmp_path / "remote")
    trainer = RewardTrainer(path, args=rm_args(tmp_path, trust_remote_code=True), train_dataset=Dataset.from_list(ROWS))
    assert type(trainer.model).__name__ == "RemoteForSequenceClassification"
    trainer.train()
    with pytest.raises(ValueError, match="custom code"):
        RewardTrainer(path, args=rm_args(tmp_path / "untrusted"), train_dataset=Dataset.from_list(ROWS))


def test_eos_token_is_the_appended_token_and_the_configs(tokenizer, tmp_path):
    tok = copy.deepcopy(tokenizer)
    model = classifier(tok)
    args = rm_args(tmp_path, eos_token="<|im_end|>", append_eos=True)
    trainer = RewardTrainer(model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == "<|im_end|>" and model.config.eos_token_id == end
    assert all(ids[-1] == end for ids in trainer.train_dataset["chosen_ids"])
    with pytest.raises(ValueError, match="eos_token='<nope>' is not in the tokenizer's vocabulary"):
        RewardTrainer(classifier(tok), args=rm_args(tmp_path, eos_token="<nope>"),
                      train_dataset=Dataset.from_list(ROWS), processing_class=tok)  # fmt: skip


def test_pad_token_sets_tokenizer_and_model_with_trls_deprecation_warning(tokenizer, tmp_path):
    tok = copy.deepcopy(tokenizer)
    model = classifier(tok)
    with pytest.warns(FutureWarning, match="`pad_token` is deprecated"):
        args = rm_args(tmp_path, pad_token="<|im_end|>")
    trainer = RewardTrainer(model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    pad = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.pad_token == "<|im_end|>" and model.config.pad_token_id == pad and trainer.pad_token_id == pad
    trainer.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        rm_args(tmp_path)


def test_chat_template_path_renders_the_conversations(tokenizer, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}")
    rows = [{"chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}],
             "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "no"}]}] * 4  # fmt: skip
    tok = copy.deepcopy(tokenizer)
    args = rm_args(tmp_path, chat_template_path=str(template), per_device_train_batch_size=4)
    trainer = RewardTrainer(classifier(tok), args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    assert tok.decode(trainer.train_dataset[0]["chosen_ids"]) == "[user]hi[assistant]yes"
    trainer.train()


@pytest.mark.parametrize("remove", [True, False])
def test_remove_unused_columns_keeps_what_the_trainer_reads(tokenizer, tmp_path, remove):
    rows = [{**row, "margin": 0.5} for row in ROWS]
    args = rm_args(tmp_path, remove_unused_columns=remove)
    trainer = RewardTrainer(classifier(tokenizer), args=args, train_dataset=Dataset.from_list(rows),
                            processing_class=tokenizer)  # fmt: skip
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["margin"].tolist() == [0.5] * 8  # the margin column reaches the loss either way
    trainer.train()
