"""PPOTrainer through TRL v0.7.1's API: generate -> score with any Python -> step -> log_stats."""

import copy
import json
import string

import pytest
import torch
from accelerate.tracking import GeneralTracker
from datasets import Dataset

from replayrl.metrics import read_metrics
from replayrl.models.tiny import build_tiny_model
from replayrl.models.value_head import AutoModelForCausalLMWithValueHead
from replayrl.ppo import LengthSampler, PPOConfig, PPOTrainer
from replayrl.ppo.batch import build_batch, forward
from tests.conftest import tiny_moe_model

SEED_STAT_KEYS = [
    "objective/kl",
    "objective/kl_coef",
    "objective/entropy",
    "ppo/loss/policy",
    "ppo/loss/value",
    "ppo/loss/total",
    "ppo/policy/entropy",
    "ppo/policy/approxkl",
    "ppo/policy/policykl",
    "ppo/policy/clipfrac",
    "ppo/policy/advantages_mean",
    "ppo/returns/mean",
    "ppo/val/vpred",
    "ppo/val/error",
    "ppo/val/clipfrac",
    "ppo/val/mean",
    "ppo/val/var",
    "ppo/mean_scores",
    "ppo/std_scores",
    "tokens/queries_len_mean",
    "tokens/responses_len_mean",
    "ppo/learning_rate",
    "time/ppo/forward_pass",
    "time/ppo/compute_rewards",
    "time/ppo/compute_advantages",
    "time/ppo/optimize_step",
    "time/ppo/total",
]
GEN = {"max_new_tokens": 6, "do_sample": True, "top_k": 0, "top_p": 1.0}


def value_model(tokenizer, seed=0):
    lm = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=seed)
    return AutoModelForCausalLMWithValueHead.from_pretrained(lm)


def make_trainer(tokenizer, tmp_path=None, dataset=None, **overrides):
    kwargs = dict(batch_size=8, mini_batch_size=4, learning_rate=1e-2, init_kl_coef=0.01, adap_kl_ctrl=False)
    if tmp_path is not None:
        kwargs["output_dir"] = str(tmp_path / "out")
    kwargs.update(overrides)
    return PPOTrainer(PPOConfig(**kwargs), value_model(tokenizer), None, tokenizer, dataset=dataset)


def queries_of(tokenizer, n=8):
    return [torch.tensor(tokenizer(f"q{i % 5}:" * (1 + i % 3)).input_ids) for i in range(n)]


@pytest.mark.parametrize("seed", [0, 1])
def test_seed_loop_reward_rises(tokenizer, tmp_path, seed):
    """TRL v0.7.1's loop, verbatim shape: dataloader -> generate -> any Python reward -> step -> log_stats."""
    lowercase = torch.tensor(tokenizer.convert_tokens_to_ids(list(string.ascii_lowercase)))
    texts = [f"q{i % 5}:" * (1 + i % 3) for i in range(16)]
    dataset = Dataset.from_dict({"query": texts, "input_ids": [tokenizer(t).input_ids for t in texts]})
    dataset.set_format("torch")
    trainer = make_trainer(tokenizer, tmp_path, dataset=dataset, batch_size=16, mini_batch_size=8, seed=seed)
    rewards_seen = []
    for _ in range(12):
        for batch in trainer.dataloader:
            responses = trainer.generate(batch["input_ids"], return_prompt=False, batch_size=16, **GEN)
            scores = [torch.isin(r, lowercase).float().mean() for r in responses]  # any Python: a scalar each
            stats = trainer.step(batch["input_ids"], responses, scores)
            trainer.log_stats(stats, {"query": batch["query"], "response": responses}, scores)
            rewards_seen.append(torch.stack(scores).mean().item())
    assert all(key in stats for key in SEED_STAT_KEYS)
    # ~0.25 -> ~0.6; the means over 3 steps, since a few sampled tokens move one step's mean by ~0.05-0.1
    assert sum(rewards_seen[-3:]) / 3 > sum(rewards_seen[:3]) / 3 + 0.15, rewards_seen
    records = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 13))
    assert records[-1]["env/reward_mean"] == pytest.approx(rewards_seen[-1], abs=1e-6)


def test_first_minibatch_has_ratio_one_and_zero_kl(tokenizer):
    trainer = make_trainer(tokenizer, ppo_epochs=2)
    queries = queries_of(tokenizer)
    responses = trainer.generate(queries, return_prompt=False, **GEN)
    trainer.step(queries, responses, [float(i) for i in range(8)])
    first = trainer.minibatch_stats[0]
    assert first["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert first["policy/approxkl"] == pytest.approx(0.0, abs=1e-9)
    assert first["policy/clipfrac"] == 0.0
    assert len(trainer.minibatch_stats) == 4  # 2 epochs x 2 mini-batches
    assert max(abs(s["policy/ratio_mean"] - 1) for s in trainer.minibatch_stats[1:]) > 1e-4  # it did train


def test_padding_changes_neither_logprobs_nor_values(tokenizer):
    model = value_model(tokenizer).eval()
    query, response = torch.tensor([5, 6, 7]), torch.tensor([8, 9])
    alone = forward(model, build_batch([query], [response], tokenizer.pad_token_id))
    padded_batch = build_batch(
        [torch.tensor([1, 2, 3, 4, 5, 6, 7]), query], [torch.tensor([3, 4, 5, 6, 7]), response], tokenizer.pad_token_id
    )
    padded = forward(model, padded_batch)
    assert padded_batch.response_mask[1].tolist() == [1, 1, 0, 0, 0]
    torch.testing.assert_close(padded.logprobs[1, :2], alone.logprobs[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(padded.values[1, :2], alone.values[0], atol=1e-5, rtol=0)


def test_step_loss_does_not_depend_on_padding(tokenizer):
    """4 samples alone, or in one mini-batch next to a mini-batch of 4 much longer samples (so padded to their
    width in the rollout pass): the same values, returns and value loss. (Advantages are whitened over the whole
    batch, so the policy loss legitimately differs.)"""
    queries, responses = queries_of(tokenizer, 4), [torch.tensor([10 + i, 11, 12][: 1 + i % 3]) for i in range(4)]
    long_q, long_r = [torch.arange(5, 25)] * 4, [torch.arange(30, 45)] * 4
    scores = [1.0, 0.0, 0.5, 0.2]
    model = value_model(tokenizer)
    config = dict(mini_batch_size=4, ppo_epochs=1, learning_rate=1e-2, init_kl_coef=0.01, adap_kl_ctrl=False)
    short = PPOTrainer(PPOConfig(batch_size=4, **config), copy.deepcopy(model), None, tokenizer)
    mixed = PPOTrainer(PPOConfig(batch_size=8, **config), copy.deepcopy(model), None, tokenizer)
    mixed._optimize = _optimize_in_order(mixed)  # rows 0..3 (the short samples) form the first mini-batch
    short.step(queries, responses, scores)
    mixed.step(queries + long_q, responses + long_r, scores + [0.0] * 4)
    a, b = short.minibatch_stats[0], mixed.minibatch_stats[0]
    for key in ("val/mean", "val/vpred", "returns/mean", "loss/value", "policy/ratio_mean"):
        assert a[key] == pytest.approx(b[key], abs=1e-5), key


def _optimize_in_order(trainer):
    def run(batch, rollout):
        trainer.minibatch_stats = []
        for start in range(0, batch.input_ids.shape[0], trainer.config.mini_batch_size):
            rows = torch.arange(start, start + trainer.config.mini_batch_size)
            trainer.minibatch_stats.append(trainer.train_minibatch(batch.select(rows), rollout, rows))
        return trainer.minibatch_stats

    return run


def test_ratio_threshold_skips_the_batch(tokenizer):
    trainer = make_trainer(tokenizer, ratio_threshold=1e-3, ppo_epochs=1)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    queries = queries_of(tokenizer)
    responses = trainer.generate(queries, return_prompt=False, **GEN)
    with pytest.warns(UserWarning, match="ratio_threshold"):
        stats = trainer.step(queries, responses, [1.0] * 8)
    assert stats["ppo/loss/total"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_early_stopping_on_target_kl(tokenizer):
    trainer = make_trainer(tokenizer, early_stopping=True, target_kl=1e-9, ppo_epochs=4, learning_rate=1e-1)
    queries = queries_of(tokenizer)
    responses = trainer.generate(queries, return_prompt=False, **GEN)
    trainer.step(queries, responses, [float(i % 2) for i in range(8)])
    assert len(trainer.minibatch_stats) == 2  # one epoch of 2 mini-batches, then stop


def test_score_scaling_normalisation_and_clipping(tokenizer):
    queries = queries_of(tokenizer)
    responses = [torch.tensor([10, 11])] * 8
    trainer = make_trainer(tokenizer, use_score_scaling=True, use_score_norm=True, ppo_epochs=1)
    stats = trainer.step(queries, responses, [float(i) for i in range(8)])
    assert stats["ppo/mean_scores"] == pytest.approx(0.0, abs=1e-6)
    assert stats["ppo/std_scores"] == pytest.approx(1.0, abs=1e-5)
    trainer = make_trainer(tokenizer, score_clip=0.5, ppo_epochs=1)
    stats = trainer.step(queries, responses, [10.0] * 8)
    assert stats["ppo/mean_scores"] == pytest.approx(0.5)


def test_response_masks(tokenizer):
    trainer = make_trainer(tokenizer, ppo_epochs=1)
    queries, responses = queries_of(tokenizer), [torch.tensor([10, 11, 12, 13])] * 8
    masks = [torch.tensor([1, 1, 0, 0])] * 8  # e.g. tool output tokens not generated by the policy
    stats = trainer.step(queries, responses, [1.0] * 8, response_masks=masks)
    assert stats["objective/kl"] == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="response_masks\\[0\\]"):
        trainer.step(queries, responses, [1.0] * 8, response_masks=[torch.tensor([1, 1])] * 8)


def test_bad_step_inputs(tokenizer):
    trainer = make_trainer(tokenizer)
    queries, responses = queries_of(tokenizer), [torch.tensor([10, 11])] * 8
    with pytest.raises(ValueError, match="scores has 7 entries but config.batch_size is 8"):
        trainer.step(queries, responses, [1.0] * 7)
    with pytest.raises(ValueError, match="one scalar"):
        trainer.step(queries, responses, [torch.ones(2)] * 8)
    with pytest.raises(ValueError, match="responses\\[0\\] must be a non-empty 1-D tensor"):
        trainer.step(queries, [torch.tensor([], dtype=torch.long)] * 8, [1.0] * 8)
    with pytest.raises(ValueError, match="finite"):
        trainer.step(queries, responses, [float("nan")] * 8)
    with pytest.raises(ValueError, match="needs `model`"):
        PPOTrainer(PPOConfig(), None, None, tokenizer)


def test_generate_shapes(tokenizer):
    trainer = make_trainer(tokenizer)
    query = torch.tensor([5, 6, 7])
    out = trainer.generate(query, max_new_tokens=4, do_sample=False)
    assert out.shape[0] == 1 and torch.equal(out[0, :3], query) and out.shape[1] <= 7
    queries = queries_of(tokenizer, 5)
    with_prompt = trainer.generate(queries, batch_size=2, max_new_tokens=4, do_sample=False)
    without = trainer.generate(queries, batch_size=3, return_prompt=False, max_new_tokens=4, do_sample=False)
    for q, w, r in zip(queries, with_prompt, without):
        assert torch.equal(w[: len(q)], q) and torch.equal(w[len(q) :], r) and 1 <= len(r) <= 4
    short = trainer.generate(queries, return_prompt=False, length_sampler=LengthSampler(1, 2), **GEN)
    assert all(len(r) == 1 for r in short)


class RecordingTracker(GeneralTracker):
    """An accelerate tracker that keeps what it is given (accelerate's own extension point)."""

    name, requires_logging_directory, main_process_only = "recording", False, True

    def __init__(self):
        super().__init__()
        self.config, self.logs = None, []

    @property
    def tracker(self):
        return self

    def store_init_configuration(self, values):
        self.config = values

    def log(self, values, step=None, **kwargs):
        self.logs.append((step, values))


def test_trackers_and_metrics_file(tokenizer, tmp_path):
    tracker = RecordingTracker()
    trainer = make_trainer(tokenizer, tmp_path, log_with=[tracker], tracker_project_name="ppo-test")
    queries, responses = queries_of(tokenizer), [torch.tensor([10, 11])] * 8
    stats = trainer.step(queries, responses, [1.0] * 8)
    trainer.log_stats(stats, {}, [1.0] * 8)
    assert tracker.config["batch_size"] == 8 and tracker.config["init_kl_coef"] == 0.01
    step, logged = tracker.logs[0]
    assert step == 1 and logged["env/reward_mean"] == 1.0 and all(k in logged for k in SEED_STAT_KEYS)
    line = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["step"] == 1 and line["reward"] == 1.0 and "ppo/loss/total" in line
    assert "objective/kl_dist" not in line  # distributions stay out of the JSON file


def test_peft_policy_uses_the_base_model_as_reference(tokenizer):
    peft = pytest.importorskip("peft")
    lm = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = AutoModelForCausalLMWithValueHead.from_pretrained(lm, peft_config=lora)
    trainer = PPOTrainer(PPOConfig(batch_size=8, mini_batch_size=4, learning_rate=1e-2), model, None, tokenizer)
    assert trainer.ref_model is None  # no copy: the reference is the policy with its adapters disabled
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    queries, responses = queries_of(tokenizer), [torch.tensor([10, 11, 12])] * 8
    first = trainer.step(queries, responses, [float(i % 2) for i in range(8)])
    assert first["objective/kl"] == pytest.approx(0.0, abs=1e-6)  # LoRA starts as the identity
    second = trainer.step(queries, responses, [float(i % 2) for i in range(8)])
    assert abs(second["objective/kl"]) > 1e-4
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)


def test_gradient_accumulation_equals_one_big_mini_batch(tokenizer):
    """2 accumulated mini-batches of 4 (one optimizer step) == one mini-batch of 8, for equal-length responses."""
    model = value_model(tokenizer)
    common = dict(batch_size=8, ppo_epochs=1, learning_rate=1e-2, init_kl_coef=0.1)
    accumulated = PPOTrainer(
        PPOConfig(mini_batch_size=4, gradient_accumulation_steps=2, **common), copy.deepcopy(model), None, tokenizer
    )
    whole = PPOTrainer(PPOConfig(mini_batch_size=8, **common), copy.deepcopy(model), None, tokenizer)
    queries, responses = queries_of(tokenizer), [torch.tensor([10 + i, 11, 12]) for i in range(8)]
    scores = [float(i % 3) for i in range(8)]
    accumulated.step(queries, responses, scores)
    whole.step(queries, responses, scores)
    # Adam divides by sqrt(v): a near-zero gradient turns float rounding into ~1e-5; a wrong accumulation is ~lr
    for a, b in zip(accumulated.model.parameters(), whole.model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), whole.model.parameters()))


def test_shared_layers_reference(tokenizer):
    model = value_model(tokenizer)
    trainer = PPOTrainer(PPOConfig(batch_size=8, mini_batch_size=4), model, None, tokenizer, num_shared_layers=1)
    shared = model.pretrained_model.model.layers[0].mlp.up_proj.weight
    assert trainer.ref_model.pretrained_model.model.layers[0].mlp.up_proj.weight is shared
    before = shared.detach().clone()
    trainer.step(queries_of(tokenizer), [torch.tensor([10, 11])] * 8, [1.0] * 8)
    assert torch.equal(shared, before)  # frozen in the policy too


def test_generate_with_a_moe_policy_that_asks_for_router_logits(tokenizer):
    """A mixture-of-experts config with output_router_logits=True generates (one query and batched) and keeps the
    setting: transformers 5.17's decoding steps otherwise crash in the model's own aux loss."""
    model = AutoModelForCausalLMWithValueHead.from_pretrained(tiny_moe_model(tokenizer))
    trainer = PPOTrainer(PPOConfig(batch_size=4, mini_batch_size=2), model, None, tokenizer)
    assert trainer.generate(torch.tensor([5, 6, 7]), max_new_tokens=3, do_sample=False).shape[1] <= 6
    assert len(trainer.generate(queries_of(tokenizer, 3), batch_size=3, return_prompt=False, **GEN)) == 3
    assert model.config.output_router_logits is True
