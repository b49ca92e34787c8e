"""Two CPU processes (gloo) == one: the loss is normalised by the completion tokens of both processes, so the
update equals the single-process update on the same global batch of prompts and sampled completions."""

from pathlib import Path

import pytest
import torch

from replayrl.data.preference import pad
from tests.conftest import launch_two_processes
from tests.distillation.test_trainer import make

WORKER = Path(__file__).with_name("distributed_worker.py")


def _concat(parts: list[dict], pad_id: int) -> dict:
    """The two processes' batches as one: prompts re-padded on the left, completions on the right."""
    out = {}
    for key, side, fill in [("prompt_ids", "left", pad_id), ("prompt_mask", "left", 0),
                            ("completion_ids", "right", pad_id), ("completion_mask", "right", 0)]:  # fmt: skip
        rows = [[int(x) for x in row[m.bool()]] if "mask" not in key else [1] * int(m.sum())
                for part in parts for row, m in zip(part[key], part[key.split("_")[0] + "_mask"])]  # fmt: skip
        out[key] = pad(rows, fill, side=side)
    tokens = sum(float(p["completion_mask"].sum()) for p in parts)
    out["step_tokens"] = torch.tensor(tokens)
    return out


def test_two_processes_equal_one(tokenizer, tmp_path):
    check_two_equal_one(launch_two_processes(WORKER, tmp_path / "distillation", 29535), tokenizer, tmp_path)


def check_two_equal_one(result: dict, tokenizer, tmp_path) -> None:
    """Loss (rel 1e-4) and parameters (rtol 1e-4, atol 1e-6) equal one process's step on the gathered batch."""
    assert result["world"] == 2
    batch = _concat(result["batches"], tokenizer.pad_token_id)
    assert batch["prompt_ids"].shape[0] == 8
    trainer = make(tokenizer, tmp_path, per_device_train_batch_size=8, beta=0.5)
    init = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    assert loss.item() == pytest.approx(result["loss"], rel=1e-4, abs=1e-6)
    assert len(result["params"]) == len(init)
    for p0, p, after in zip(init, trainer.model.parameters(), result["params"]):
        torch.testing.assert_close(p0 - p.grad, after, rtol=1e-4, atol=1e-6)
