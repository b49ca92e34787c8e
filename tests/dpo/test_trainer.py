"""DPOTrainer through train(): ln 2 at step 1, learning, reference handling, loss variants, bad input."""

import math

import pytest
import torch
from datasets import Dataset

from replayrl.algos.preference import PairLogps, dpo_losses
from replayrl.dpo import DPOConfig, DPOTrainer
from replayrl.metrics import METRICS_FILE, read_metrics
from replayrl.models.tiny import build_tiny_model
from replayrl.tasks.preferences import preference_datasets
from tests.conftest import assert_same_updates

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


def tiny(tokenizer, seed=0):
    return build_tiny_model(tokenizer, seed=seed, **SMALL)


def dpo_args(tmp_path, **overrides):
    kwargs = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        max_steps=1,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    kwargs.update(overrides)
    return DPOConfig(**kwargs)


@pytest.fixture(scope="module")
def pairs_data():
    train, held_out = preference_datasets(seed=0, per_problem=1, rejected="near_miss")
    return train.select(range(16)), held_out


def losses(trainer):
    return [r["loss"] for r in trainer.state.log_history if "loss" in r]


def first_batch(trainer):
    return next(iter(trainer.get_train_dataloader()))


def test_step1_loss_is_ln2_when_policy_equals_reference(tokenizer, pairs_data, tmp_path):
    trainer = DPOTrainer(
        tiny(tokenizer), args=dpo_args(tmp_path), train_dataset=pairs_data[0], processing_class=tokenizer
    )
    trainer.train()
    assert losses(trainer)[0] == pytest.approx(math.log(2), abs=1e-6)
    first = read_metrics(tmp_path / "out" / METRICS_FILE)[0]
    for key in ("rewards/chosen", "rewards/margins", "logps/chosen", "logits/rejected", "rewards/accuracies"):
        assert key in first
    assert abs(first["rewards/margins"]) < 1e-5


def test_learns_the_preference(tokenizer, pairs_data, tmp_path):
    args = dpo_args(tmp_path, max_steps=16, logging_steps=4, lr_scheduler_type="constant")
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=pairs_data[0], processing_class=tokenizer)
    trainer.train()
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert logs[-1]["loss"] < logs[0]["loss"] - 0.1
    assert logs[-1]["rewards/accuracies"] >= 0.9
    assert logs[-1]["rewards/margins"] > logs[0]["rewards/margins"]


def test_one_concatenated_forward_equals_two_forwards(tokenizer, pairs_data, tmp_path):
    model = tiny(tokenizer)
    trainer = DPOTrainer(model, args=dpo_args(tmp_path), train_dataset=pairs_data[0], processing_class=tokenizer)
    batch = first_batch(trainer)
    chosen, rejected, _, _ = trainer.concatenated_forward(model, batch)
    for side, got in (("chosen", chosen), ("rejected", rejected)):
        ids, mask, labels = batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"], batch[f"{side}_labels"]
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, :-1], -1)
        target = labels[:, 1:]
        token = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * (target != -100)
        assert torch.allclose(got, token.sum(1), atol=1e-5)


def test_precomputed_reference_gives_the_live_loss(tokenizer, pairs_data, tmp_path):
    def run(precompute):
        args = dpo_args(tmp_path / str(precompute), max_steps=3, precompute_ref_log_probs=precompute)
        trainer = DPOTrainer(
            tiny(tokenizer), ref_model=tiny(tokenizer, seed=1), args=args, train_dataset=pairs_data[0],
            processing_class=tokenizer,
        )  # fmt: skip
        assert (trainer.ref_model is None) == precompute
        trainer.train()
        assert trainer.ref_model is None or not precompute
        return losses(trainer)

    live, pre = run(False), run(True)
    assert abs(live[0] - math.log(2)) > 1e-3  # a different reference: a non-trivial check
    assert pre == pytest.approx(live, abs=1e-5)


def test_precompute_without_ref_model_uses_the_initial_policy(tokenizer, pairs_data, tmp_path):
    args = dpo_args(tmp_path, precompute_ref_log_probs=True)
    held_out = pairs_data[1].select(range(8))
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=pairs_data[0], eval_dataset=held_out,
                         processing_class=tokenizer)  # fmt: skip
    assert trainer.ref_model is None and "ref_chosen_logps" in trainer.train_dataset.column_names
    assert "ref_rejected_logps" in trainer.eval_dataset.column_names
    assert trainer.evaluate()["eval_loss"] == pytest.approx(math.log(2), abs=1e-6)  # before training
    trainer.train()
    assert losses(trainer)[0] == pytest.approx(math.log(2), abs=1e-6)
    with pytest.raises(ValueError, match="released the reference model"):  # the reference is gone
        trainer.evaluate(held_out)
    assert trainer.evaluate()["eval_rewards/margins"] != 0


def test_peft_reference_is_the_base_model(tokenizer, pairs_data, tmp_path):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = dpo_args(tmp_path, max_steps=3, learning_rate=5e-2)
    base = tiny(tokenizer)
    trainer = DPOTrainer(base, args=args, train_dataset=pairs_data[0], processing_class=tokenizer, peft_config=config)
    assert trainer.ref_model is None
    trainer.train()
    assert losses(trainer)[0] == pytest.approx(math.log(2), abs=1e-6)  # LoRA starts as the identity
    batch = {k: v for k, v in first_batch(trainer).items()}
    ref_c, _ = trainer.compute_ref_log_probs(batch)
    pol_c, _, _, _ = trainer.concatenated_forward(trainer.model, batch)
    fresh_c, _, _, _ = trainer.concatenated_forward(tiny(tokenizer), batch)
    assert torch.allclose(ref_c, fresh_c, atol=1e-5)  # adapter disabled == the untouched base weights
    assert not torch.allclose(pol_c, ref_c, atol=1e-4)  # the adapter has trained


@pytest.mark.parametrize(
    "loss_type", ["sigmoid", "hinge", "ipo", "robust", "nca_pair", "sppo_hard", "apo_zero", "discopop", "aot", "sft"]
)
def test_loss_variant_reaches_the_loss(tokenizer, pairs_data, tmp_path, loss_type):
    """The first logged loss equals the pure function on the first batch's log-probs (a different reference so
    that every variant sees Delta != 0)."""
    data = pairs_data[0]
    args = dpo_args(tmp_path, loss_type=loss_type, label_smoothing=0.1 if loss_type == "robust" else 0.0,
                    per_device_train_batch_size=len(data))  # fmt: skip
    policy, ref = tiny(tokenizer), tiny(tokenizer, seed=1)
    trainer = DPOTrainer(policy, ref_model=ref, args=args, train_dataset=data, processing_class=tokenizer)
    with torch.no_grad():
        out = trainer._forward(policy, first_batch(trainer))
        ref_c, ref_r = trainer.compute_ref_log_probs(first_batch(trainer))
    pairs = PairLogps(out["chosen_logps"], out["rejected_logps"], ref_c, ref_r, out["chosen_lengths"],
                      out["rejected_lengths"])  # fmt: skip
    expected, _ = dpo_losses(loss_type, pairs, 0.1, label_smoothing=args.label_smoothing)
    trainer.train()
    assert losses(trainer)[0] == pytest.approx(expected.mean().item(), abs=1e-5)


def test_weighted_loss_types_and_rpo(tokenizer, pairs_data, tmp_path):
    data = pairs_data[0]
    args = dpo_args(tmp_path, loss_type=["sigmoid", "sft"], loss_weights=[0.5, 2.0], rpo_alpha=0.3,
                    per_device_train_batch_size=len(data))  # fmt: skip
    policy = tiny(tokenizer)
    trainer = DPOTrainer(policy, args=args, train_dataset=data, processing_class=tokenizer)
    with torch.no_grad():
        out = trainer._forward(policy, first_batch(trainer))
    nll = (-out["chosen_logps"] / out["chosen_lengths"]).mean().item()
    trainer.train()
    first = trainer.state.log_history[0]
    assert first["loss"] == pytest.approx(0.5 * math.log(2) + 2.0 * nll + 0.3 * nll, abs=1e-5)
    assert first["loss/sft"] == pytest.approx(nll, abs=1e-5)


def test_reference_free_and_wpo_run(tokenizer, pairs_data, tmp_path):
    args = dpo_args(tmp_path, reference_free=True, use_weighting=True, max_steps=2)
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=pairs_data[0], processing_class=tokenizer)
    assert trainer.ref_model is None
    trainer.train()
    assert all(math.isfinite(x) for x in losses(trainer))


def test_sync_ref_model_moves_the_reference(tokenizer, pairs_data, tmp_path):
    args = dpo_args(tmp_path, sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=1.0)
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=pairs_data[0], processing_class=tokenizer)
    trainer.train()
    for ref, pol in zip(trainer.ref_model.parameters(), trainer.model.parameters()):
        assert torch.equal(ref, pol)  # alpha 1: the reference is now the policy


def test_seed_api_names(tokenizer, pairs_data, tmp_path):
    trainer = DPOTrainer(
        tiny(tokenizer), args=dpo_args(tmp_path), beta=0.5, max_length=6, truncation_mode="keep_end",
        train_dataset=pairs_data[0], tokenizer=tokenizer,
    )  # fmt: skip
    assert trainer.args.beta == 0.5
    assert first_batch(trainer)["chosen_input_ids"].shape[1] <= 6
    c = torch.tensor([-1.0])
    loss, cr, rr = trainer.dpo_loss(c, torch.tensor([-7.0]), torch.tensor([-5.0]), torch.tensor([-5.0]))
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-3.0))))  # beta 0.5 * Delta 6
    assert (cr.item(), rr.item()) == pytest.approx((2.0, -1.0))
    loss, _, _ = trainer.dpo_loss(c, c, torch.tensor([5.0]), torch.tensor([-5.0]), reference_free=True)
    assert loss.item() == pytest.approx(math.log(2))


def test_reference_free_on_the_config_reaches_dpo_loss(tokenizer, pairs_data, tmp_path):
    args = dpo_args(tmp_path, reference_free=True, beta=0.5)
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=pairs_data[0], processing_class=tokenizer)
    c, r = torch.tensor([-1.0]), torch.tensor([-7.0])
    # references are ignored: Delta = beta * (-1 - -7) = 3, whatever reference log-probs are passed
    loss, cr, rr = trainer.dpo_loss(c, r, torch.tensor([-50.0]), torch.tensor([9.0]))
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-3.0))))
    assert (cr.item(), rr.item()) == pytest.approx((-0.5, -3.5))  # beta * policy log-prob
    loss, _, _ = trainer.dpo_loss(c, r, torch.tensor([-50.0]), torch.tensor([9.0]), reference_free=False)
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-0.5 * (6.0 - (-59.0))))), abs=1e-6)


def test_conversational_implicit_prompt_data(tokenizer, tmp_path):
    chat = lambda role, text: {"role": role, "content": text}  # noqa: E731
    rows = [
        {"chosen": [chat("user", f"{a}+1?"), chat("assistant", str(a + 1))],
         "rejected": [chat("user", f"{a}+1?"), chat("assistant", str(a + 2))]}
        for a in range(8)
    ]  # fmt: skip
    trainer = DPOTrainer(tiny(tokenizer), args=dpo_args(tmp_path), train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer)  # fmt: skip
    row = trainer.train_dataset[0]
    assert tokenizer.decode(row["prompt_ids"]).endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(row["chosen_ids"]) == "1<|im_end|>\n"  # as TRL 1.16: no EOS after the template's turn
    trainer.train()
    assert losses(trainer)[0] == pytest.approx(math.log(2), abs=1e-6)


def test_bad_input(tokenizer, pairs_data, tmp_path):
    model = tiny(tokenizer)
    with pytest.raises(ValueError, match="ref_model is the same object as model"):
        DPOTrainer(model, ref_model=model, args=dpo_args(tmp_path), train_dataset=pairs_data[0],
                   processing_class=tokenizer)  # fmt: skip
    bad = Dataset.from_dict({"prompt": ["1+1="], "answer": ["2"]})
    with pytest.raises(ValueError, match=r"not a preference dataset: it has columns \['prompt', 'answer'\]"):
        DPOTrainer(model, args=dpo_args(tmp_path), train_dataset=bad, processing_class=tokenizer)
    with pytest.raises(ValueError, match="valid loss types are"):
        dpo_args(tmp_path, loss_type="sigmod")
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_args(tmp_path, label_smoothing=0.5)
    with pytest.raises(ValueError, match="sync_ref_model"):
        dpo_args(tmp_path, sync_ref_model=True, precompute_ref_log_probs=True)


LAYOUTS = {"two_rows": dict(prefix_sharing=False), "shared": {}, "packed": dict(padding_free=True)}


def assert_same_weights(got: dict, expected: dict) -> None:
    """Same trained weights, up to float rounding (Adam: lr-sized steps from ~0 grads). The key-projection bias is
    left out: q . (k_j + b) shifts every key's score of a query alike, which softmax ignores, so its gradient is
    zero in exact arithmetic and only rounding noise in float; Adam's normalised step turns that noise into
    moves of up to lr, whose value depends on the summation order of the layout and the CPU (2.15e-5 apart on
    one machine, 1.8e-5 on another, for a 2e-5 tolerance)."""
    assert got.keys() == expected.keys()
    for name, value in got.items():
        if not name.endswith("k_proj.bias"):
            torch.testing.assert_close(value, expected[name], atol=2e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def run_layout(tokenizer, tmp_path, rows, attn, layout, **overrides):
    """3 steps on `rows` in one of the layouts (prefix sharing is the default); the logged rows, the trained
    weights, and the widths of the policy's input rows."""
    model = tiny(tokenizer)
    model.config._attn_implementation = attn
    args = dpo_args(tmp_path / layout, max_steps=3, use_weighting=True, loss_type=["sigmoid", "ipo"],
                    **{**LAYOUTS[layout], **overrides})  # fmt: skip
    ref = tiny(tokenizer, seed=1)
    ref.config._attn_implementation = attn
    trainer = DPOTrainer(model, ref_model=ref, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer)  # fmt: skip
    shapes = []
    model.model.embed_tokens.register_forward_hook(lambda m, inputs, out: shapes.append(tuple(inputs[0].shape)))
    trainer.train()
    logged = [r for r in trainer.state.log_history if "loss" in r]
    return logged, {n: p.detach().clone() for n, p in model.named_parameters()}, shapes


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_prefix_sharing_and_padding_free_give_the_two_row_losses_and_updates(tokenizer, tmp_path, attn):
    """Rows of very different lengths scored three ways: two padded rows per pair, one prefix-shared row per
    pair, all packed into one row. Same losses, metrics and trained weights over three steps, with a
    length-normalised loss and WPO weights in the mix; the shared layout feeds the model fewer tokens."""
    rows = [{"prompt": "x" * (1 + 3 * i), "chosen": "y" * (1 + i % 3), "rejected": "z" * (4 - i % 3)} for i in range(8)]
    runs = {layout: run_layout(tokenizer, tmp_path, rows, attn, layout) for layout in LAYOUTS}
    (base, base_weights, base_shapes) = runs["two_rows"]
    for layout in ("shared", "packed"):
        logged, weights, _ = runs[layout]
        for a, b in zip(base, logged):
            for key in ("loss", "loss/ipo", "logps/chosen", "logps/rejected", "logits/rejected", "rewards/margins"):
                assert b[key] == pytest.approx(a[key], abs=1e-5), (layout, key)
        assert_same_weights(weights, base_weights)
    shared_shapes = runs["shared"][2]
    assert [s[0] for s in base_shapes] == [16] * 3 and all(s[0] <= 8 for s in shared_shapes)  # short pairs pack
    assert sum(math.prod(s) for s in shared_shapes) < 0.8 * sum(math.prod(s) for s in base_shapes)


@pytest.mark.parametrize("cut", [{}, dict(max_length=9, truncation_mode="keep_end")])
def test_prefix_sharing_when_completions_share_a_start_or_truncation_cuts_the_prompts_apart(tokenizer, tmp_path, cut):
    """The shared prefix is the longest common start: it runs into the completions when they begin alike, and is
    shorter than the prompt when keep_end cut a long chosen's prompt more than a short rejected's. Either way
    the same losses and updates as two rows."""
    rows = [{"prompt": "abcdefgh" + "x" * i, "chosen": "yy" + "y" * 3 * (i % 2), "rejected": "yz"} for i in range(8)]
    shared, shared_weights, shapes = run_layout(tokenizer, tmp_path, rows, "sdpa", "shared", **cut)
    base, base_weights, _ = run_layout(tokenizer, tmp_path, rows, "sdpa", "two_rows", **cut)
    assert all(s[0] <= 8 for s in shapes)
    assert [r["loss"] for r in shared] == pytest.approx([r["loss"] for r in base], abs=1e-5)
    assert_same_weights(shared_weights, base_weights)


def test_sync_ref_model_survives_resume(tokenizer, pairs_data, tmp_path):
    common = dict(sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=0.5, max_steps=2)
    first = DPOTrainer(tiny(tokenizer), args=dpo_args(tmp_path, save_strategy="steps", save_steps=2, **common),
                       train_dataset=pairs_data[0], processing_class=tokenizer)  # fmt: skip
    first.train()
    resumed = DPOTrainer(tiny(tokenizer), args=dpo_args(tmp_path, **common), train_dataset=pairs_data[0],
                         processing_class=tokenizer)  # fmt: skip
    fresh = [p.detach().clone() for p in resumed.ref_model.parameters()]
    resumed.train(resume_from_checkpoint=True)
    for saved, loaded in zip(first.ref_model.parameters(), resumed.ref_model.parameters()):
        assert torch.equal(saved, loaded)
    assert any(not torch.equal(a, b) for a, b in zip(fresh, resumed.ref_model.parameters()))


def test_gradient_accumulation_8x1_equals_1x8(tokenizer, pairs_data, tmp_path):
    """replayrl scales the loss itself (replayrl.accumulation): the same SGD update on any transformers version."""
    results = []
    for bs, ga in [(8, 1), (1, 8), (2, 4)]:
        args = dpo_args(tmp_path / f"{bs}x{ga}", per_device_train_batch_size=bs, gradient_accumulation_steps=ga,
                        optim="sgd", learning_rate=1.0, max_grad_norm=0.0)  # fmt: skip
        trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=pairs_data[0], processing_class=tokenizer)
        trainer.train()
        results.append((losses(trainer)[0], [p.detach().clone() for p in trainer.model.parameters()]))
    assert_same_updates(results, list(tiny(tokenizer).parameters()))
