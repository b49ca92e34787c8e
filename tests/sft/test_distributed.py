"""Two CPU processes under `accelerate launch` (gloo) give the same loss and update as one process on the same
global batch: the loss is normalised by the trained tokens of the whole batch across processes."""

from pathlib import Path

import pytest
import torch

from replayrl.models.tiny import build_tokenizer
from tests.conftest import launch_two_processes
from tests.sft.helpers import varied_dataset
from tests.sft.test_trainer import one_step

WORKER = Path(__file__).with_name("distributed_worker.py")


def launch(out: Path, mode: str) -> dict:
    return launch_two_processes(WORKER, out, 29547, mode)


@pytest.mark.slow
def test_two_packed_processes_match_one_unpacked_process(tmp_path):
    # each process trains on one packed row (documents kept apart) holding a different number of tokens
    check_two_equal_one(launch(tmp_path / "ddp", "packed"), tmp_path)


def check_two_equal_one(result: dict, tmp_path) -> None:
    """Two packed processes == one unpacked process: loss (abs 1e-5), parameters (rtol 1e-4, atol 1e-6), and
    the token count reduced over both processes."""
    assert result["world"] == 2
    loss, params = one_step(
        tmp_path, "single", varied_dataset(), per_device_train_batch_size=4, max_grad_norm=0.0, max_length=24
    )
    assert result["loss"] == pytest.approx(loss, abs=1e-5)
    torch.testing.assert_close(torch.cat([p.flatten() for p in result["params"]]), params, rtol=1e-4, atol=1e-6)
    # metrics are reduced over both processes: every input token of the global batch is counted once
    tok = build_tokenizer()
    rows = varied_dataset()
    assert result["log"]["num_tokens"] == sum(
        len(tok(p + c).input_ids) + 1 for p, c in zip(rows["prompt"], rows["completion"])
    )
    assert 0.0 <= result["log"]["mean_token_accuracy"] <= 1.0 and result["log"]["entropy"] > 0
