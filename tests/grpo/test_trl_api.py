"""TRL 1.16's GRPO API beyond the config, through train() and the public methods: reward functions that log
(`log_extra`, `log_metric`), `get_off_policy_mask` / `get_high_entropy_mask` (hand values, and overrides that change
what is trained), the entropy bonus's logged `policy_loss` / `entropy_coef`, iterable datasets, TRL's warnings."""

import pytest
import torch
from datasets import DatasetDict

from replayrl import GRPOConfig, GRPOTrainer, algos
from replayrl.algos.policy_losses import sapo_loss
from replayrl.models.tiny import prompt_dataset
from tests.conftest import tiny_args


def varied_reward(completions, **kwargs):
    return [float(sum(map(ord, str(c))) % 7) for c in completions]


def make(model, tokenizer, dataset, tmp_path, reward=varied_reward, cls=GRPOTrainer, eval_dataset=None, **overrides):
    args = tiny_args(GRPOConfig, tmp_path, **overrides)
    return cls(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, eval_dataset=eval_dataset,
        processing_class=tokenizer,
    )  # fmt: skip


def test_reward_functions_log_extra_columns_and_metrics(model, tokenizer, dataset, tmp_path, capsys):
    calls = []

    def logging_reward(completions, log_extra, log_metric, **kwargs):
        calls.append([c[:2] for c in completions])
        log_extra("head", calls[-1])
        log_metric("call_index", float(len(calls) - 1))  # 0.0 at step 1, 1.0 at step 2
        log_metric("pair", 1.0)
        log_metric("pair", 3.0)  # two values in one step: their mean, 2.0, is logged
        return varied_reward(completions)

    trainer = make(model, tokenizer, dataset, tmp_path, reward=logging_reward, log_completions=True, logging_steps=1)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["call_index"] for h in logs] == [0.0, 1.0]
    assert [h["pair"] for h in logs] == [2.0, 2.0]
    # the completions table: TRL's `_logs` (every process's last generation batch) and the printed rows
    assert list(trainer._logs["extra"]["head"]) == calls[-1]
    assert len(trainer._logs["prompt"]) == len(trainer._logs["advantages"]) == 4
    assert list(trainer._logs["rewards"]["logging_reward"]) == varied_reward(trainer._logs["completion"])
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("prompt "))
    assert header.endswith("| logging_reward | head")  # the printed table has the column too


def test_all_none_rewards_warning_names_the_sample(model, tokenizer, dataset, tmp_path, caplog):
    def half_none(completions, **kwargs):  # completions 0 and 2 of each group are scored by no function
        return [None if i % 2 == 0 else 1.0 * i for i in range(len(completions))]

    trainer = make(model, tokenizer, dataset, tmp_path, reward=half_none, max_steps=1)
    with caplog.at_level("WARNING"):
        trainer.train()
    message = next(r.getMessage() for r in caplog.records if "All reward functions returned None" in r.getMessage())
    assert "'prompt':" in message and "'completion':" in message and "'answer':" in message  # the dataset column


def test_get_off_policy_mask_hand_values():
    advantages = torch.tensor([[1.0], [-1.0], [-1.0]])
    logps = torch.tensor([[-2.0] * 4, [-0.5] * 4, [-2.0] * 4])  # mean KL vs zero sampling log-probs: 2, 0.5, 2
    keep = GRPOTrainer.get_off_policy_mask(advantages, logps, torch.zeros(3, 4), torch.ones(3, 4), 1.0)
    assert keep.tolist() == [[1.0], [1.0], [0.0]]  # positive advantage kept; low KL kept; negative + high KL dropped


def test_get_sapo_token_loss_is_the_sapo_gate_trained_with():
    ratio = torch.tensor([[1.0, 1.5, 0.5]])
    torch.testing.assert_close(GRPOTrainer.get_sapo_token_loss(torch.ones(2, 4), 1.0), torch.full((2, 4), 2.0))
    gate = GRPOTrainer.get_sapo_token_loss(ratio, 2.0)
    torch.testing.assert_close(gate, torch.sigmoid(2.0 * (ratio - 1)) * 2.0)  # 4 / tau = 2
    params = algos.PolicyLossParams(sapo_temperature_pos=2.0, sapo_temperature_neg=2.0)
    logps, old = ratio.log(), torch.zeros_like(ratio)
    loss = sapo_loss(logps, old, torch.tensor([0.5]), torch.ones_like(ratio), "token", params)
    torch.testing.assert_close(loss.per_token_loss, -gate * 0.5)


def test_get_high_entropy_mask_hand_values(model, tokenizer, dataset, tmp_path):
    trainer = make(model, tokenizer, dataset, tmp_path)
    entropies = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])  # 1.1 and 1.2 are padding
    # the 0.8 quantile of the 10 real entropies 0.1..1.0 is 0.82: keep 0.9 and 1.0
    assert trainer.get_high_entropy_mask(entropies, mask, 0.8).nonzero().tolist() == [[1, 2], [1, 3]]
    assert trainer.get_high_entropy_mask(entropies, mask, 0.0).equal(mask.bool())
    assert not trainer.get_high_entropy_mask(entropies, torch.zeros_like(mask), 0.5).any()


class DropEverything(GRPOTrainer):
    """Overrides both mask methods: records their arguments and masks every token and sequence out."""

    calls: list

    def get_high_entropy_mask(self, entropies, mask, threshold):
        self.calls.append(("entropy", threshold, mask.dtype))
        return torch.zeros_like(mask, dtype=torch.bool)

    @staticmethod
    def get_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold):
        DropEverything.calls.append(("off_policy", off_policy_threshold, tuple(advantages.shape)))
        return torch.zeros(advantages.shape[0], 1)


def test_overriding_the_mask_methods_changes_what_is_trained(model, tokenizer, dataset, tmp_path):
    DropEverything.calls = []
    trainer = make(
        model, tokenizer, dataset, tmp_path, cls=DropEverything, beta=0.0, top_entropy_quantile=0.2,
        off_policy_mask_threshold=0.5, max_steps=2,
    )  # fmt: skip
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert ("entropy", pytest.approx(0.8), torch.bool) in DropEverything.calls  # threshold = 1 - top_entropy_quantile
    assert ("off_policy", 0.5, (4, 1)) in DropEverything.calls  # advantages (B, 1), as TRL passes them
    assert len(DropEverything.calls) == 4  # both methods, once per micro-batch, 2 micro-batches
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())  # nothing left to train on


def test_entropy_bonus_logs_policy_loss_and_coef(model, tokenizer, dataset, tmp_path):
    trainer = make(model, tokenizer, dataset, tmp_path, entropy_coef=0.5, logging_steps=1, beta=0.0)
    trainer.train()
    for h in [h for h in trainer.state.log_history if "loss" in h]:
        # one micro-batch per step: loss = policy_loss - 0.5 * (mean token entropy, the logged `entropy`)
        assert h["entropy_coef"] == 0.5
        assert h["loss"] == pytest.approx(h["policy_loss"] - 0.5 * h["entropy"], abs=1e-4)
    assert trainer.entropy_coef == 0.5


def test_adaptive_entropy_updates_once_per_optimizer_step(model, tokenizer, dataset, tmp_path):
    trainer = make(
        model, tokenizer, dataset, tmp_path, per_device_train_batch_size=2, num_generations=2,
        gradient_accumulation_steps=2, max_steps=3, logging_steps=1, beta=0.0, entropy_coef=0.01,
        use_adaptive_entropy=True, entropy_target=15.0, entropy_coef_delta=0.005,
    )  # fmt: skip
    trainer.train()
    assert trainer.entropy_coef == pytest.approx(0.01 + 3 * 0.005)  # entropy < target at every step: +delta
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["entropy_coef"] for h in logs] == pytest.approx([0.015, 0.02, 0.025])
    assert logs[0]["loss"] == pytest.approx(logs[0]["policy_loss"], abs=1e-4)  # no bonus before a measurement
    assert logs[1]["loss"] < logs[1]["policy_loss"]  # then the bonus of the previous step's coefficient


def test_iterable_datasets_at_construction(model, tokenizer, tmp_path, caplog):
    stream = prompt_dataset(16).to_iterable_dataset()
    with caplog.at_level("WARNING"):
        trainer = make(model, tokenizer, stream, tmp_path, dataloader_num_workers=2)
    assert trainer.args.accelerator_config.dispatch_batches is False  # each process reads its own slice
    assert trainer.args.dataloader_num_workers == 0 and "dataloader_num_workers=0" in caplog.text
    with pytest.raises(ValueError, match="Iterable datasets require `dispatch_batches=False`"):
        make(model, tokenizer, stream, tmp_path, accelerator_config={"dispatch_batches": True})
    with pytest.raises(TypeError, match="must be a `Dataset` or `IterableDataset`, got `DatasetDict`"):
        make(model, tokenizer, DatasetDict({"train": prompt_dataset(16)}), tmp_path)


def test_iterable_eval_set_reads_with_one_worker_only_for_itself(model, tokenizer, dataset, tmp_path):
    evaluation = prompt_dataset(8, seed=1).to_iterable_dataset()
    trainer = make(model, tokenizer, dataset, tmp_path, eval_dataset=evaluation, dataloader_num_workers=2)
    assert trainer.get_train_dataloader().num_workers == 2
    assert trainer.get_eval_dataloader().num_workers == 0
    assert trainer.args.dataloader_num_workers == 2  # the override is scoped to the eval loader


def test_sequence_level_ratio_with_a_token_sum_loss_warns(caplog):
    with caplog.at_level("WARNING"):
        GRPOConfig(output_dir="x", importance_sampling_level="sequence", loss_type="grpo", report_to="none")
    assert "weights each sequence by its completion length" not in caplog.text
    with caplog.at_level("WARNING"):
        GRPOConfig(output_dir="x", importance_sampling_level="sequence", loss_type="dapo", report_to="none")
    assert "weights each sequence by its completion length" in caplog.text


def test_per_token_logps_and_entropies_with_trls_signature(model, tokenizer, dataset, tmp_path):
    trainer = make(model, tokenizer, dataset, tmp_path, entropy_coef=0.1, temperature=1.0)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    logps, entropies, aux = trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, torch.ones_like(ids), logits_to_keep=4, compute_entropy=True
    )
    # the slow reference: full logits, position t predicts token t + 1
    reference = torch.log_softmax(trainer.model(input_ids=ids).logits[:, -5:-1].float(), dim=-1)
    assert torch.allclose(logps, reference.gather(-1, ids[:, -4:, None]).squeeze(-1), atol=1e-5)
    assert torch.allclose(entropies, -(reference.exp() * reference).sum(-1), atol=1e-5)
    assert entropies.requires_grad and aux is None  # the bonus is on: its entropies carry a gradient
    trainer.entropy_coef = 0.0
    _, entropies, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, torch.ones_like(ids), logits_to_keep=4, compute_entropy=True
    )
    assert not trainer._entropy_bonus_enabled and not entropies.requires_grad
