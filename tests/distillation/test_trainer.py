"""DistillationTrainer end to end on tiny local Qwen2s: learning, what it trained on, TRL's fields, invariances."""

import pytest
import torch

from replayrl import DistillationConfig, DistillationTrainer
from replayrl.algos.distillation import generalized_jsd
from replayrl.models.tiny import build_tiny_model, prompt_dataset
from tests.conftest import assert_accumulation_invariant, full_and_resumed_logs, loss_logs
from tests.trl_fields.parity import mismatches

SIZE = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


def dist_args(tmp_path, **overrides):
    kwargs = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_steps=2, learning_rate=1e-2,
                  max_completion_length=6, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                  seed=0, disable_tqdm=True, bf16=False, gradient_checkpointing=False)  # fmt: skip
    return DistillationConfig(**{**kwargs, **overrides})


def make(tokenizer, tmp_path, **overrides):
    student = build_tiny_model(tokenizer, seed=0, **SIZE)
    teacher = build_tiny_model(tokenizer, seed=1, **SIZE)
    args = dist_args(tmp_path, **overrides)
    return DistillationTrainer(
        student, teacher, args=args, train_dataset=prompt_dataset(16), processing_class=tokenizer
    )


def test_every_trl_field_with_trl_defaults():
    assert mismatches(DistillationConfig, "distillation") == []


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"use_vllm": True, "vllm_mode": "remote"}, "vllm_mode must be 'colocate' or 'server'"),
        ({"beta": 1.5}, r"beta must be in \[0, 1\]"),
        ({"max_tool_calling_iterations": 2}, "no tool calling"),
    ],
)
def test_options_that_cannot_apply_are_refused_with_the_fix(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        dist_args(tmp_path, **overrides)


def test_no_teacher_or_another_vocabulary_is_refused(tokenizer, tmp_path):
    student = build_tiny_model(tokenizer, **SIZE)
    with pytest.raises(ValueError, match="No teacher"):
        DistillationTrainer(
            student, args=dist_args(tmp_path), train_dataset=prompt_dataset(4), processing_class=tokenizer
        )
    other = build_tiny_model(tokenizer, **SIZE)
    other.resize_token_embeddings(other.config.vocab_size + 8)
    with pytest.raises(ValueError, match="must share a vocabulary"):
        DistillationTrainer(student, other, args=dist_args(tmp_path), train_dataset=prompt_dataset(4),
                            processing_class=tokenizer)  # fmt: skip


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_trains_on_the_jsd_of_its_own_samples(tokenizer, tmp_path, beta):
    """The logged loss is the generalised JSD recomputed from both models' full logits on the completions the
    student sampled, averaged over their tokens."""
    trainer = make(tokenizer, tmp_path, max_steps=1, beta=beta, temperature=0.8)
    seen, original = [], trainer.compute_loss
    trainer.compute_loss = lambda model, inputs, *a, **kw: seen.append(inputs) or original(model, inputs, *a, **kw)
    student0 = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    (batch,) = seen
    fresh = build_tiny_model(tokenizer, **SIZE)
    fresh.load_state_dict(student0)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    width, real = batch["completion_ids"].shape[1], batch["completion_mask"].bool()
    with torch.no_grad():
        s = fresh(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1][real]
        t = trainer.teacher_model(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1][real]
    expected = generalized_jsd(s, t, beta, temperature=0.8).mean()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected.item(), rel=1e-4)
    assert real.sum() > 8  # the completions were sampled, several tokens each


def test_learns_to_match_the_teacher(tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path, max_steps=20, logging_steps=5, learning_rate=3e-2, max_completion_length=4)
    trainer.train()
    divergences = [h["divergence"] for h in trainer.state.log_history if "divergence" in h]
    assert divergences[-1] < 0.5 * divergences[0], divergences


def test_gradient_accumulation_1x8_equals_8x1(tokenizer, tmp_path):
    make_in = lambda out, **kw: make(tokenizer, out, **kw)  # noqa: E731
    assert_accumulation_invariant(make_in, tmp_path, steps=2, beta=0.5)


def test_exact_resume(tokenizer, tmp_path):
    def run(out, stop=False, resume=None):
        trainer = make(tokenizer, tmp_path, output_dir=str(out), per_device_train_batch_size=4, max_steps=4,
                       save_strategy="steps", save_steps=1)  # fmt: skip
        return loss_logs(trainer, stop, resume)

    for x, y in full_and_resumed_logs(run, tmp_path):
        for k in ("loss", "grad_norm", "completions/mean_length"):
            assert y[k] == pytest.approx(x[k], rel=1e-4, abs=1e-6), (x["step"], k)


def test_text_prompts_get_the_tokenizers_bos_as_trl(bos_tokenizer, tmp_path):
    """TRL 1.16's distillation tokenizes plain-text prompts with the tokenizer's special tokens: a Llama-style BOS
    (`<s>` = 101) first; a conversation carries the chat template's own, once."""
    trainer = make(bos_tokenizer, tmp_path)
    out = trainer._generate([{"prompt": "1+2="}, {"prompt": "Hi"}])
    rows = [ids[mask.bool()].tolist() for ids, mask in zip(out["prompt_ids"], out["prompt_mask"])]
    assert rows == [[101, 57, 76, 58, 84], [101, 37, 12]]
    chat = trainer._generate([{"prompt": [{"role": "user", "content": "q"}]}] * 2)
    ids = chat["prompt_ids"][0][chat["prompt_mask"][0].bool()].tolist()
    assert ids[0] == 101 and ids.count(101) == 1
