"""DPO evaluation with a `compute_metrics`: one (chosen, rejected) implicit-reward row per pair, whatever the
vocabulary, through train() and evaluate()."""

import numpy as np
import pytest
import torch

from replayrl.dpo import DPOTrainer
from tests.dpo.test_trainer import dpo_args, pairs_data, tiny  # noqa: F401


def completion_logps(model, prompt: list[int], completion: list[int]) -> float:
    """Slow reference: summed log-probs of `completion` after `prompt`, from one plain forward."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    targets = ids[0, 1:]
    picked = logps.gather(1, targets[:, None])[:, 0]
    return float(picked[len(prompt) - 1 :].sum())


def test_compute_metrics_gets_the_implicit_rewards_of_every_pair(tokenizer, pairs_data, tmp_path):  # noqa: F811
    held_out = pairs_data[1].select(range(11))
    seen = []

    def compute_metrics(eval_pred):
        seen.append(eval_pred)
        rewards = np.asarray(eval_pred.predictions)
        return {"pair_accuracy": float((rewards[:, 0] > rewards[:, 1]).mean()), "rewards/accuracies": -1.0}

    args = dpo_args(tmp_path, max_steps=4, per_device_eval_batch_size=4)  # 11 pairs: batches of 4, 4 and 3
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=pairs_data[0], eval_dataset=held_out,
                         processing_class=tokenizer, compute_metrics=compute_metrics)  # fmt: skip
    trainer.train()
    metrics = trainer.evaluate()

    rewards, labels = np.asarray(seen[-1].predictions), np.asarray(seen[-1].label_ids)
    assert rewards.shape == (11, 2) and labels.shape == (11,)
    assert (labels == 0).all()  # column 0, the chosen completion, is the preferred one
    assert np.abs(rewards).max() > 1e-4  # trained: the policy has left the reference
    assert metrics["eval_pair_accuracy"] == pytest.approx(float((rewards[:, 0] > rewards[:, 1]).mean()))
    assert metrics["eval_rewards/accuracies"] == -1.0  # compute_metrics' value, not overwritten by batch means
    assert "eval_rewards/margins" in metrics and "eval_loss" in metrics

    # each row is beta * (log pi - log pi_ref) of that pair, in dataset order (slow reference, rows 0 and 10)
    policy, ref = trainer.model.eval(), trainer.ref_model
    for i in (0, 10):
        row = trainer.eval_dataset[i]
        for column, side in enumerate(("chosen", "rejected")):
            prompt, completion = row["prompt_ids"], row[f"{side}_ids"]
            expected = args.beta * (
                completion_logps(policy, prompt, completion) - completion_logps(ref, prompt, completion)
            )
            assert rewards[i, column] == pytest.approx(expected, abs=1e-4)


def test_compute_metrics_is_logged_during_training(tokenizer, pairs_data, tmp_path):  # noqa: F811
    """TRL's test_train_with_compute_metrics, on the local tiny model."""
    args = dpo_args(tmp_path, max_steps=4, eval_strategy="steps", eval_steps=2)
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=pairs_data[0],
                         eval_dataset=pairs_data[1].select(range(4)), processing_class=tokenizer,
                         compute_metrics=lambda eval_pred: {"my_metric": 0.123})  # fmt: skip
    trainer.train()
    evals = [r for r in trainer.state.log_history if "eval_loss" in r]
    assert len(evals) == 2 and all(r["eval_my_metric"] == 0.123 for r in evals)
    assert trainer.state.log_history[-2]["eval_my_metric"] == 0.123


def test_predict_gives_zero_rewards_before_training(tokenizer, pairs_data, tmp_path):  # noqa: F811
    trainer = DPOTrainer(tiny(tokenizer), args=dpo_args(tmp_path), train_dataset=pairs_data[0],
                         eval_dataset=pairs_data[1].select(range(3)), processing_class=tokenizer)  # fmt: skip
    output = trainer.predict(trainer.eval_dataset)  # predictions without any compute_metrics
    assert output.predictions.shape == (3, 2) and output.label_ids.shape == (3,)
    assert np.abs(output.predictions).max() < 1e-6  # the policy is the reference: every reward is 0
