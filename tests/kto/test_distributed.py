"""Two CPU processes (gloo) == one: the reference point is estimated over both processes' rows, and two SGD
steps give the single-process parameters on the same 8 rows per step."""

from pathlib import Path

import pytest
import torch

from tests.conftest import launch_two_processes
from tests.kto.test_trainer import make

WORKER = Path(__file__).with_name("distributed_worker.py")


def test_two_processes_equal_one(tokenizer, tmp_path):
    check_two_equal_one(launch_two_processes(WORKER, tmp_path / "kto", 29541), tokenizer, tmp_path)


def check_two_equal_one(result: dict, tokenizer, tmp_path) -> None:
    """Two SGD steps: logged loss, KL and margins (rel 1e-4) and parameters (rtol 1e-4, atol 1e-6) of one process."""
    assert result["world"] == 2
    trainer = make(tokenizer, tmp_path, per_device_train_batch_size=8, max_steps=2, optim="sgd", learning_rate=1.0,
                   max_grad_norm=0.0)  # fmt: skip
    trainer.train()
    for one, two in zip(trainer.state.log_history[:2], result["logs"][:2]):
        for key in ("loss", "kl", "rewards/margins"):
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
    assert result["logs"][1]["kl"] > 0
    assert len(result["params"]) == len(list(trainer.model.parameters()))
    for a, b in zip(trainer.model.parameters(), result["params"]):
        torch.testing.assert_close(a.detach(), b, rtol=1e-4, atol=1e-6)
