"""`replayrl grpo --async_generation true`: the built-in job runs asynchronously with one flag; colocated vLLM is
refused in one line."""

from __future__ import annotations

import multiprocessing

import pytest

from replayrl.cli import main
from replayrl.metrics import METRICS_FILE, read_metrics


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_builtin_job_runs_asynchronously(tmp_path, capsys, fast_warm_up):
    out = tmp_path / "grpo"
    argv = ["grpo", "--async_generation", "true", "--output_dir", str(out), "--max_steps", "3", "--logging_steps", "1",
            "--eval_strategy", "no", "--per_device_train_batch_size", "16"]  # fmt: skip
    assert main(argv) == 0
    records = [r for r in read_metrics(out / METRICS_FILE) if "reward" in r]
    assert [r["async/staleness/max"] for r in records] == [0.0, 1.0, 1.0]
    assert "replayrl grpo: done" in capsys.readouterr().out
    assert multiprocessing.active_children() == []


def test_colocated_vllm_is_refused_in_one_line(capsys):
    assert main(["grpo", "--async_generation", "true", "--use_vllm", "true", "--vllm_mode", "colocate"]) == 2
    err = capsys.readouterr().err
    assert "colocate" in err and len(err.strip().splitlines()) == 1
