"""GRPOTrainer end to end on a tiny local Qwen2: TRL's documented example, every knob, bad input, invariances."""

import copy

import pytest
import torch

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.rewards.builtin import reward_len
from tests.conftest import full_and_resumed_logs, loss_logs, tiny_args


def varied_reward(completions, **kwargs):
    """Deterministic given the completions, and different across a group almost always."""
    return [float(sum(map(ord, c)) % 7) for c in completions]


def make_trainer(model, tokenizer, dataset, tmp_path, reward=varied_reward, **overrides):
    args = tiny_args(GRPOConfig, tmp_path, **overrides)
    return GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer)


def test_seed_example_from_a_local_path_changes_parameters(model_dir, dataset, tmp_path):
    args = tiny_args(GRPOConfig, tmp_path, max_steps=2)
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward_len, args=args, train_dataset=dataset)
    before = {n: p.clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]
    assert len(changed) == len(before)
    log = trainer.state.log_history[0]
    for key in [
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "kl",
        "entropy",
        "completion_length",
        "num_tokens",
        "clip_ratio/region_mean",
        "rewards/reward_len/mean",
        "timing/generation",
        "timing/optimization",
    ]:
        assert key in log, key


def test_beta_zero_loads_no_reference_and_logs_no_kl(model, tokenizer, dataset, tmp_path):
    trainer = make_trainer(model, tokenizer, dataset, tmp_path, beta=0.0, max_steps=1)
    assert trainer.ref_model is None
    trainer.train()
    assert "kl" not in trainer.state.log_history[0]


def test_beta_positive_uses_a_frozen_reference(model, tokenizer, dataset, tmp_path):
    trainer = make_trainer(model, tokenizer, dataset, tmp_path, beta=0.1, max_steps=3)
    ref_before = {n: p.clone() for n, p in trainer.ref_model.named_parameters()}
    trainer.train()
    assert all(torch.equal(ref_before[n], p) for n, p in trainer.ref_model.named_parameters())
    assert trainer.state.log_history[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == ref at step 0
    assert trainer.state.log_history[2]["kl"] > 0


def test_sync_ref_model_mixes_policy_into_reference(model, tokenizer, dataset, tmp_path):
    trainer = make_trainer(
        model,
        tokenizer,
        dataset,
        tmp_path,
        beta=0.1,
        sync_ref_model=True,
        ref_model_sync_steps=1,
        ref_model_mixup_alpha=0.5,
        max_steps=1,
    )
    ref0 = {n: p.clone() for n, p in trainer.ref_model.named_parameters()}
    trainer.train()
    for (n, ref), pol in zip(trainer.ref_model.named_parameters(), trainer.model.parameters()):
        assert torch.allclose(ref, 0.5 * ref0[n] + 0.5 * pol, atol=1e-6), n


def test_num_iterations_computes_old_logps_and_reuses_the_batch(model, tokenizer, dataset, tmp_path):
    calls = []

    def counting(completions, **kw):
        calls.append(1)
        return varied_reward(completions)

    trainer = make_trainer(
        model, tokenizer, dataset, tmp_path, reward=counting, num_iterations=2, max_steps=4, beta=0.0
    )
    trainer.train()
    assert len(calls) == 2  # one generation serves two optimizer steps
    assert "timing/logps" in trainer.state.log_history[0]  # the old-log-prob pass ran
    assert any(h["clip_ratio/region_mean"] >= 0 for h in trainer.state.log_history[:4])


def test_on_policy_skips_the_old_logps_pass(model, tokenizer, dataset, tmp_path):
    trainer = make_trainer(model, tokenizer, dataset, tmp_path, beta=0.0, max_steps=1)
    trainer.train()
    assert "timing/logps" not in trainer.state.log_history[0]
    mb = trainer._micro_batches[0]
    assert mb.old_logps is not None and not mb.old_logps.isnan().any()  # filled by the first loss pass


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_loss_types_and_scalings_train(model, tokenizer, dataset, tmp_path, loss_type, scale_rewards):
    trainer = make_trainer(
        model, tokenizer, dataset, tmp_path, loss_type=loss_type, scale_rewards=scale_rewards, max_steps=1
    )
    before = [p.clone() for p in trainer.model.parameters()]
    trainer.train()
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters()))


def test_generation_knobs_reach_generate(model, tokenizer, dataset, tmp_path):
    trainer = make_trainer(
        model,
        tokenizer,
        dataset,
        tmp_path,
        temperature=0.5,
        top_p=0.8,
        top_k=7,
        min_p=0.05,
        repetition_penalty=1.3,
        max_completion_length=3,
    )
    gc = trainer.generation_config
    assert (gc.temperature, gc.top_p, gc.top_k, gc.min_p, gc.repetition_penalty) == (0.5, 0.8, 7, 0.05, 1.3)
    assert gc.max_new_tokens == 3
    trainer.train()
    assert trainer.state.log_history[0]["completions/max_length"] <= 3


def test_max_prompt_length_keeps_the_end_of_the_prompt(model, tokenizer, dataset, tmp_path):
    trainer = make_trainer(model, tokenizer, dataset, tmp_path, max_prompt_length=4, max_steps=1)
    trainer.train()
    mb = trainer._micro_batches[0]
    assert mb.prompt_ids.shape[1] == 4
    text = tokenizer.decode(mb.prompt_ids[0][mb.prompt_mask[0].bool()])
    assert any(p.endswith(text) for p in dataset["prompt"])


def test_mask_truncated_completions_removes_them_from_the_loss(model, tokenizer, dataset, tmp_path):
    # 1-token completions are nearly always truncated; with beta=0 masked rows contribute nothing
    trainer = make_trainer(
        model,
        tokenizer,
        dataset,
        tmp_path,
        max_completion_length=1,
        mask_truncated_completions=True,
        beta=0.0,
        max_steps=1,
    )
    trainer.train()
    mb = trainer._micro_batches[0]
    assert torch.equal(mb.loss_weights.sum(1) == 0, mb.truncated)


def test_conversational_prompts_train(model, tokenizer, chat_dataset, tmp_path):
    seen = {}

    def spy(prompts, completions, **kw):
        seen["p"], seen["c"] = prompts[0], completions[0]
        return varied_reward([c[0]["content"] for c in completions])

    trainer = make_trainer(model, tokenizer, chat_dataset, tmp_path, reward=spy, max_steps=1)
    trainer.train()
    assert seen["p"][0]["role"] == "user" and seen["c"][0]["role"] == "assistant"
    prompt_text = tokenizer.decode(trainer._micro_batches[0].prompt_ids[0], skip_special_tokens=False)
    assert "<|im_start|>assistant\n" in prompt_text  # the chat template was applied


def test_log_completions_prints_a_table(model, tokenizer, dataset, tmp_path, capsys):
    make_trainer(model, tokenizer, dataset, tmp_path, log_completions=True, max_steps=1).train()
    assert "completion" in capsys.readouterr().out


def test_eval_logs_eval_metrics(model, tokenizer, dataset, tmp_path):
    args = tiny_args(
        GRPOConfig, tmp_path, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=4, max_steps=1
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=varied_reward,
        args=args,
        train_dataset=dataset,
        eval_dataset=dataset.select(range(2)),
        processing_class=tokenizer,
    )
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert evals and "eval_reward" in evals[0]


def test_eval_batch_not_a_multiple_of_num_generations_is_refused_at_construction(model, tokenizer, dataset, tmp_path):
    args = tiny_args(GRPOConfig, tmp_path, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=6)
    with pytest.raises(ValueError, match=r"per_device_eval_batch_size \(6\).*num_generations \(4\).*=4"):
        GRPOTrainer(model=model, reward_funcs=varied_reward, args=args, train_dataset=dataset,
                    eval_dataset=dataset.select(range(2)), processing_class=tokenizer)  # fmt: skip
    # without an eval dataset nothing is evaluated, so nothing is refused
    args = tiny_args(GRPOConfig, tmp_path, per_device_eval_batch_size=6)
    GRPOTrainer(model=model, reward_funcs=varied_reward, args=args, train_dataset=dataset, processing_class=tokenizer)


def test_peft_lora_with_kl_uses_the_base_model_as_reference(model, tokenizer, dataset, tmp_path):
    from peft import LoraConfig

    args = tiny_args(GRPOConfig, tmp_path, beta=0.1, max_steps=2)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=varied_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    )
    assert trainer.ref_model is None
    lora = {n: p.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    assert any(not torch.equal(lora[n], p) for n, p in trainer.model.named_parameters() if n in lora)
    assert "kl" in trainer.state.log_history[-2]


def test_loss_is_invariant_to_gradient_accumulation_splits(tokenizer, dataset, tmp_path):
    """1 micro-batch of 8 rows == 8 micro-batches of 1 row: same generation, same SGD update."""
    from replayrl.models.tiny import build_tiny_model

    results = {}
    for loss_type in ["grpo", "bnpo", "dr_grpo", "dapo"]:
        for bs, ga in [(8, 1), (1, 8), (2, 4)]:
            model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
            trainer = make_trainer(
                model,
                tokenizer,
                dataset,
                tmp_path / f"{loss_type}{bs}",
                loss_type=loss_type,
                per_device_train_batch_size=bs,
                gradient_accumulation_steps=ga,
                max_steps=1,
                optim="sgd",
                learning_rate=1.0,
                max_grad_norm=0.0,
                beta=0.1,
            )
            trainer.train()
            results[(loss_type, bs)] = (
                [p.detach().clone() for p in trainer.model.parameters()],
                trainer.state.log_history[0]["loss"],
            )
        ref_params, ref_loss = results[(loss_type, 8)]
        for bs in (1, 2):
            params, loss = results[(loss_type, bs)]
            assert loss == pytest.approx(ref_loss, rel=1e-4, abs=1e-6), (loss_type, bs)
            for a, b in zip(params, ref_params):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_dataset_without_prompt_column_is_rejected(model, tokenizer, dataset, tmp_path):
    bad = dataset.rename_column("prompt", "question")
    with pytest.raises(ValueError, match="no 'prompt' column.*rename_column"):
        make_trainer(model, tokenizer, bad, tmp_path)


def test_missing_model_path_is_a_clear_error(dataset, tmp_path):
    with pytest.raises(ValueError, match="Could not load model"):
        GRPOTrainer(
            model=str(tmp_path / "nope"),
            reward_funcs=reward_len,
            args=tiny_args(GRPOConfig, tmp_path),
            train_dataset=dataset,
        )


def test_model_init_kwargs_with_a_model_object_is_rejected(model, tokenizer, dataset, tmp_path):
    with pytest.raises(ValueError, match="model_init_kwargs"):
        make_trainer(model, tokenizer, dataset, tmp_path, model_init_kwargs={"dtype": "float32"})


def test_save_model_round_trips(model, tokenizer, dataset, tmp_path):
    from transformers import AutoModelForCausalLM

    trainer = make_trainer(model, tokenizer, dataset, tmp_path, max_steps=1)
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"))
    for a, b in zip(loaded.parameters(), copy.deepcopy(trainer.model).parameters()):
        torch.testing.assert_close(a, b)


def test_resume_from_a_checkpoint_in_the_middle_of_a_generation_cycle(tokenizer, dataset, tmp_path):
    """steps_per_generation=2: one generation serves two optimizer steps; a checkpoint after the first step
    must carry the generation batch in progress, so the resumed run trains on the same rows."""

    from replayrl.models.tiny import build_tiny_model

    def run(out, stop=False, resume=None):
        model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
        trainer = make_trainer(
            model,
            tokenizer,
            dataset,
            tmp_path,
            output_dir=str(out),
            steps_per_generation=2,
            per_device_train_batch_size=2,
            max_steps=4,
            save_strategy="steps",
            save_steps=1,
        )
        return loss_logs(trainer, stop, resume)

    pairs = full_and_resumed_logs(run, tmp_path)
    for x, y in pairs:
        for k in ("loss", "grad_norm", "kl", "entropy"):
            assert y[k] == pytest.approx(x[k], rel=1e-4, abs=1e-6), (x["step"], k)


def test_training_from_python_writes_metrics_jsonl_that_plot_can_draw(model, tokenizer, dataset, tmp_path):
    from replayrl.metrics import METRICS_FILE, read_metrics
    from replayrl.metrics.plot import plot_run

    trainer = make_trainer(model, tokenizer, dataset, tmp_path, max_steps=2)
    trainer.train()
    records = read_metrics(tmp_path / "out" / METRICS_FILE)
    assert [r["step"] for r in records if "loss" in r] == [1, 2]
    assert all("reward" in r for r in records if "loss" in r)
    assert plot_run(tmp_path / "out").stat().st_size > 10_000


def test_policy_log_probs_through_the_fused_head_equal_the_full_logits_ones(model, tokenizer, dataset, tmp_path):
    """The loss pass never forms the logits, and gives the log-probs, entropies and gradients of the plain
    full-vocabulary log-softmax at the sampling temperature."""
    from types import SimpleNamespace

    from replayrl.models.lm_head import fused_head

    trainer = make_trainer(model, tokenizer, dataset, tmp_path, temperature=0.7)
    assert fused_head(trainer.model) is not None  # the path under test
    g = torch.Generator().manual_seed(0)
    rollout = SimpleNamespace(
        prompt_ids=torch.randint(3, 90, (3, 4), generator=g),
        prompt_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]]),
        completion_ids=torch.randint(3, 90, (3, 5), generator=g),
        completion_mask=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]),
    )
    logps, entropy, _ = trainer._policy_forward(trainer.model, rollout, with_entropy=True)
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)
    logits = trainer.model(input_ids=ids, attention_mask=mask).logits[:, 3:-1].float() / 0.7
    logp = torch.log_softmax(logits, -1)
    plain = logp.gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logps, plain)
    torch.testing.assert_close(entropy, -(logp.exp() * logp).sum(-1))
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    weights = rollout.completion_mask.float()
    for a, b in zip(
        torch.autograd.grad((logps * weights).sum(), params), torch.autograd.grad((plain * weights).sum(), params)
    ):
        torch.testing.assert_close(a, b)
