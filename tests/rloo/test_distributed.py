"""Two CPU processes (gloo) == one: the advantages are normalised over the global batch, and the loss and the
update equal the single-process ones on the same global batch."""

from pathlib import Path

import pytest
import torch

from replayrl import RLOOConfig, RLOOTrainer
from replayrl.algos.rloo import rloo_advantages
from replayrl.grpo.rollout import Rollout
from replayrl.models.tiny import build_tiny_model, prompt_dataset
from tests.conftest import launch_two_processes, tiny_args

WORKER = Path(__file__).with_name("distributed_worker.py")


def test_two_processes_equal_one(tokenizer, tmp_path):
    check_two_equal_one(launch_two_processes(WORKER, tmp_path / "rloo", 29543), tokenizer, tmp_path)


def check_two_equal_one(result: dict, tokenizer, tmp_path) -> None:
    """Advantages over both processes (rtol 1e-4, atol 1e-5); loss (rel 1e-4) and parameters (rtol 1e-4, atol 1e-6)
    equal one process's step on the gathered batch."""
    assert result["world"] == 2
    batch = Rollout.concat([Rollout.from_state_dict(mb) for rank in result["batches"] for mb in rank])
    assert batch.num_rows == 8
    mask = batch.completion_mask.bool()
    kl = torch.where(mask, batch.old_logps - batch.ref_logps, 0.0).sum(-1)
    expected = rloo_advantages(batch.rewards - 0.1 * kl, 4, normalize=True)  # statistics of both processes
    torch.testing.assert_close(batch.advantages, expected, rtol=1e-4, atol=1e-5)

    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = tiny_args(RLOOConfig, tmp_path, per_device_train_batch_size=8, beta=0.1, bf16=False,
                     gradient_checkpointing=False)  # fmt: skip
    trainer = RLOOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                          train_dataset=prompt_dataset(8), processing_class=tokenizer)  # fmt: skip
    init = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, trainer._finalize_rollout(batch.with_(old_logps=None)))
    loss.backward()
    assert loss.item() == pytest.approx(result["loss"], rel=1e-4, abs=1e-6)
    assert len(result["params"]) == len(init)
    for p0, p, after in zip(init, trainer.model.parameters(), result["params"]):
        torch.testing.assert_close(p0 - p.grad, after, rtol=1e-4, atol=1e-6)
