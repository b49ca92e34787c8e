"""Current-TRL GRPOConfig options and trainer checks through train()/evaluate(): streaming datasets,
num_generations_eval, multi-objective aggregation, generation/chat-template kwargs, padding, fp32 LM head, MoE
router loss, dropout, TRL's trainer attributes, and the options refused with a reason."""

import copy

import pytest
import torch

from replayrl import GRPOConfig, GRPOTrainer, algos
from replayrl.models.tiny import build_tiny_model, prompt_dataset
from tests.conftest import tiny_args, tiny_moe_model


def varied_reward(completions, **kwargs):
    return [float(sum(map(ord, str(c))) % 7) for c in completions]


def make(model, tokenizer, dataset, tmp_path, reward=varied_reward, eval_dataset=None, **overrides):
    args = tiny_args(GRPOConfig, tmp_path, **overrides)
    return GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, eval_dataset=eval_dataset,
        processing_class=tokenizer,
    )  # fmt: skip


def test_streaming_dataset_trains_and_evaluates_in_whole_groups(model, tokenizer, tmp_path):
    seen = []

    def recording_reward(prompts, completions, **kwargs):
        seen.append(list(prompts))
        return varied_reward(completions)

    train = prompt_dataset(16).to_iterable_dataset()
    evaluation = prompt_dataset(8, seed=1).to_iterable_dataset()
    trainer = make(
        model, tokenizer, train, tmp_path, reward=recording_reward, eval_dataset=evaluation, max_steps=2,
        per_device_eval_batch_size=4,
    )  # fmt: skip
    trainer.train()
    assert len(seen) == 2 and seen[0] != seen[1]  # two generations, on different prompts
    for batch in seen:
        assert [len(set(batch[i : i + 4])) for i in range(0, len(batch), 4)] == [1] * (len(batch) // 4)
    metrics = trainer.evaluate()
    assert "eval_reward" in metrics
    assert len(seen) == 2 + 8  # 8 eval prompts x 4 completions, 4 rows per batch


def test_num_generations_eval_sets_the_eval_group_size(model, tokenizer, dataset, tmp_path):
    groups = []

    def reward(prompts, completions, **kwargs):
        groups.append(len(prompts))
        return varied_reward(completions)

    trainer = make(
        model, tokenizer, dataset, tmp_path, reward=reward, eval_dataset=prompt_dataset(4, seed=2),
        num_generations_eval=2, per_device_eval_batch_size=2,
    )  # fmt: skip
    metrics = trainer.evaluate()
    assert groups == [2, 2, 2, 2]  # 4 prompts x 2 completions, 2 rows per batch
    assert "eval_reward_std" in metrics


def test_normalize_then_sum_advantages_are_what_was_trained_on(model, tokenizer, dataset, tmp_path):
    scores = []

    def big(completions, **kwargs):
        out = [100.0 * (len(c) % 3) for c in completions]
        scores.append(out)
        return out

    def small(completions, **kwargs):
        out = [float(sum(map(ord, c)) % 2) for c in completions]
        scores.append(out)
        return out

    trainer = make(
        model, tokenizer, dataset, tmp_path, reward=[big, small], multi_objective_aggregation="normalize_then_sum",
        max_steps=1,
    )  # fmt: skip
    trainer.train()
    per_func = torch.tensor(scores).T  # (N, 2)
    expected = algos.normalize_then_sum_advantages(per_func, torch.ones(2), 4)[1]
    torch.testing.assert_close(trainer._micro_batches[0].advantages, expected)


def test_generation_kwargs_override_and_padding_to_a_multiple(model, tokenizer, dataset, tmp_path):
    trainer = make(
        model, tokenizer, dataset, tmp_path, max_steps=1, generation_kwargs={"max_new_tokens": 2},
        pad_to_multiple_of=8,
    )  # fmt: skip
    trainer.train()
    batch = trainer._micro_batches[0]
    assert batch.completion_mask.sum(1).max() <= 2  # max_completion_length=6 overridden
    assert batch.completion_ids.shape[1] == 8 and batch.prompt_ids.shape[1] % 8 == 0


def test_chat_template_kwargs_reach_the_template(model, tokenizer, chat_dataset, tmp_path):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{% if system_hint %}HINT {% endif %}" + tokenizer.chat_template
    trainer = make(
        model, tok, chat_dataset, tmp_path, max_steps=1, log_completions=True,
        chat_template_kwargs={"system_hint": True},
    )  # fmt: skip
    trainer._generate_and_score([chat_dataset[0]] * 4, mode="eval")
    assert all(p.startswith("HINT ") for p in trainer._last_completions["prompt"])
    assert "advantage" in trainer._last_completions and "varied_reward" in trainer._last_completions


def test_cast_lm_head_to_fp32_with_tied_embeddings(tokenizer, dataset, tmp_path):
    """TRL 1.16: the shared weight becomes fp32, the embedding's output is cast back, the logits are fp32."""
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             dtype=torch.bfloat16)  # fmt: skip
    trainer = make(model, tokenizer, dataset, tmp_path, cast_lm_head_to_fp32=True, max_steps=1)
    before = trainer.model.lm_head.weight.detach().clone()
    trainer.train()
    assert trainer.model.lm_head.weight is trainer.model.model.embed_tokens.weight  # still tied
    assert trainer.model.lm_head.weight.dtype == torch.float32 and not torch.equal(before, trainer.model.lm_head.weight)
    ids = torch.tensor([[5, 6, 7]])
    assert trainer.model.model.embed_tokens(ids).dtype == torch.bfloat16  # the body runs in its own dtype
    assert trainer.model(input_ids=ids).logits.dtype == torch.float32


def test_cast_lm_head_to_fp32(tokenizer, dataset, tmp_path):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             dtype=torch.bfloat16)  # fmt: skip
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    trainer = make(model, tokenizer, dataset, tmp_path, cast_lm_head_to_fp32=True, max_steps=1)
    trainer.train()
    assert trainer.model.lm_head.weight.dtype == torch.float32
    assert trainer.model.model.embed_tokens.weight.dtype == torch.bfloat16
    out = trainer.model(input_ids=torch.tensor([[5, 6, 7]]))
    assert out.logits.dtype == torch.float32


def test_moe_router_aux_loss_is_added(tokenizer, dataset, tmp_path):
    model = tiny_moe_model(tokenizer, bos_token_id=tokenizer.eos_token_id)
    trainer = make(model, tokenizer, dataset, tmp_path, max_steps=1, router_aux_loss_coef=0.5)
    assert trainer.aux_loss_enabled
    trainer.train()
    assert trainer.state.log_history[0]["aux_loss"] > 0


def test_disable_dropout_and_trl_attributes(tokenizer, dataset, tmp_path):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    model.config.attention_dropout = 0.3
    trainer = make(model, tokenizer, dataset, tmp_path, disable_dropout=True, reward=[varied_reward, varied_reward],
                   reward_weights=[1.0, 2.0])  # fmt: skip
    assert trainer.model.config.attention_dropout == 0.0
    assert trainer.reward_func_names == ["varied_reward", "varied_reward"]
    assert trainer.reward_processing_classes == [None, None]
    assert trainer.reward_weights.tolist() == [1.0, 2.0]
    assert trainer.num_generations_eval == trainer.num_generations == 4


def test_construction_refusals(model, tokenizer, dataset, tmp_path):
    with pytest.raises(ValueError, match="must match"):
        GRPOTrainer(
            model=model, reward_funcs=[varied_reward, varied_reward], args=tiny_args(GRPOConfig, tmp_path),
            train_dataset=dataset, processing_class=tokenizer, reward_processing_classes=[tokenizer],
        )  # fmt: skip


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"use_liger_kernel": True}, "use_liger_kernel"),
        ({"log_completions_hub_repo": "me/completions"}, "Hub"),
        ({"transformers_continuous_batching_config": 3}, "transformers_continuous_batching_config"),
        ({"loss_type": "luspo"}, "importance_sampling_level='sequence'"),
        ({"loss_type": "vespo", "importance_sampling_level": "sequence"}, "already weights whole sequences"),
        ({"importance_sampling_level": "word"}, "'word'"),
        ({"delta": 1.1}, "delta"),
        ({"multi_objective_aggregation": "max"}, "'max'"),
        ({"top_entropy_quantile": 1.5}, "top_entropy_quantile"),
        ({"num_generations_eval": 3, "per_device_eval_batch_size": 4}, "num_generations_eval"),
        ({"scale_rewards": "mean", "multi_objective_aggregation": "normalize_then_sum"}, "sum_then_normalize"),
    ],
)
def test_config_refuses_with_a_reason(overrides, match):
    base = dict(output_dir="/tmp/replayrl-parity", report_to="none", use_cpu=True, num_generations=4,
                per_device_train_batch_size=4)  # fmt: skip
    with pytest.raises(ValueError, match=match):
        GRPOConfig(**{**base, **overrides})


def test_trl_attributes_and_trust_remote_code(model_dir, dataset, tmp_path):
    args = tiny_args(GRPOConfig, tmp_path, trust_remote_code=True, loss_type="cispo", epsilon_high=5.0)
    trainer = GRPOTrainer(model=model_dir, reward_funcs=varied_reward, args=args, train_dataset=dataset)
    assert (trainer.loss_type, trainer.epsilon_low, trainer.epsilon_high) == ("cispo", 0.2, 5.0)
    assert trainer.importance_sampling_level == "token" and trainer.beta == 0.04


def test_completions_table_extras():
    from replayrl.grpo.reporting import completions_table, format_table

    table = {"prompt": ["a", "a", "b"], "completion": ["x", "y", "z"], "reward": [1.0, 0.0, 2.0],
             "advantage": [0.7, -0.7, 0.0]}  # fmt: skip
    rows = completions_table(table, None, unique_prompts=True)
    assert [r["completion"] for r in rows] == ["x", "z"]
    assert len(completions_table(table, 2, unique_prompts=False)) == 2
    text = format_table(rows)
    assert "advantage" in text.splitlines()[0] and "0.700" in text
