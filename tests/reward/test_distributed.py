"""Two CPU processes under `accelerate launch` (gloo) give the same loss and update as one process on the same
global batch, with the pairs scored as prefix-shared rows (the head's outputs caught inside DDP's forward)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.reward.distributed_worker import result, run

WORKER = Path(__file__).with_name("distributed_worker.py")


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    out = tmp_path / "ddp"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(WORKER.parents[2])}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", "--multi_gpu", "--main_process_port", "29527"]
    proc = subprocess.run([*cmd, str(WORKER), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    two = torch.load(out / "result.pt", weights_only=False)
    one = result(run(str(tmp_path / "single"), per_device_batch=8))
    assert two["world"] == 2 and one["world"] == 1
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-5)
    changed = [not torch.equal(a, b) for a, b in zip(one["params"], run_params_before())]
    assert changed[-1]  # the score head (last parameter) moved: the hooked path reaches it
    for a, b in zip(two["params"], one["params"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def run_params_before() -> list[torch.Tensor]:
    from replayrl.models.tiny import build_tiny_sequence_classifier, build_tokenizer
    from tests.reward.distributed_worker import SMALL

    model = build_tiny_sequence_classifier(build_tokenizer(), seed=0, **SMALL)
    return [p.detach() for p in model.parameters()]
