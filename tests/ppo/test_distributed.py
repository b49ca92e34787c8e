"""Two processes under `accelerate launch` give the same losses and the same update as one process."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import cpu_launch_env
from tests.ppo import dist_step

SCRIPT = Path(__file__).with_name("dist_step.py")
ROOT = Path(__file__).resolve().parents[2]


def run(args: list[str], out: Path) -> tuple[dict, dict, str]:
    out.mkdir()
    cmd = [*args, str(SCRIPT), str(out)]
    done = subprocess.run(cmd, env=cpu_launch_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return load_file(str(out / "params.safetensors")), json.loads((out / "stats.json").read_text()), done.stderr


@pytest.mark.slow
def test_two_processes_equal_one(tmp_path):
    accelerate = Path(sys.executable).with_name("accelerate")
    accelerate = str(accelerate) if accelerate.exists() else shutil.which("accelerate")
    (tmp_path / "one").mkdir()
    dist_step.main(str(tmp_path / "one"))  # one process: right here
    one_params = load_file(str(tmp_path / "one" / "params.safetensors"))
    one_stats = json.loads((tmp_path / "one" / "stats.json").read_text())
    two_params, two_stats, log = run(
        [
            accelerate,
            "launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            "29545",
        ],
        tmp_path / "two",
    )
    assert "rank 1 of 2" in log  # really two processes
    for key, value in one_stats.items():
        assert two_stats[key] == pytest.approx(value, abs=1e-5), key
    for name, tensor in one_params.items():
        torch.testing.assert_close(two_params[name], tensor, atol=1e-5, rtol=1e-4, msg=name)
