"""Two CPU processes under `accelerate launch` (gloo) give the same loss and update as one process on the same
global batch: the loss is normalised by the trained tokens of the whole batch across processes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from replayrl.models.tiny import build_tokenizer
from tests.sft.helpers import varied_dataset
from tests.sft.test_trainer import one_step

WORKER = Path(__file__).with_name("distributed_worker.py")


def launch(out: Path, mode: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(WORKER.parent.parent.parent)}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", "--multi_gpu", "--main_process_port", "29533"]
    proc = subprocess.run([*cmd, str(WORKER), str(out), mode], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(out / "result.pt", weights_only=False)


@pytest.mark.slow
def test_two_packed_processes_match_one_unpacked_process(tmp_path):
    # each process trains on one packed row (documents kept apart) holding a different number of tokens
    result = launch(tmp_path / "ddp", "packed")
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
