"""`replayrl distillation`: the built-in offline job runs end to end (short), a user student/teacher/file works."""

from __future__ import annotations

import json

import pytest

from replayrl.cli import main
from replayrl.metrics import METRICS_FILE, PLOT_FILE, read_metrics


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_builtin_job_runs_and_writes_metrics_and_plot(tmp_path, capsys, fast_warm_up):
    out = tmp_path / "distillation"
    argv = ["distillation", "--output_dir", str(out), "--max_steps", "4", "--logging_steps", "2", "--eval_steps", "2",
            "--per_device_train_batch_size", "8"]  # fmt: skip
    assert main(argv) == 0
    records = read_metrics(out / METRICS_FILE)
    assert any("divergence" in r for r in records) and any("eval_divergence" in r for r in records)
    assert (out / PLOT_FILE).is_file() and (out / "config.json").is_file()
    printed = capsys.readouterr().out
    assert "replayrl distillation: built-in job" in printed and "divergence: " in printed


def test_user_student_teacher_and_prompts(tmp_path, capsys):
    from replayrl.models.tiny import save_tiny

    student = save_tiny(tmp_path / "s", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    teacher = save_tiny(tmp_path / "t", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=1)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1="}) + "\n" for a in range(8)))
    argv = ["distillation", "--model_name_or_path", student, "--teacher_model_name_or_path", teacher,
            "--dataset_name", str(data), "--max_steps", "1", "--logging_steps", "1", "--max_completion_length", "4",
            "--per_device_train_batch_size", "4", "--bf16", "false", "--output_dir", str(tmp_path / "o")]  # fmt: skip
    assert main(argv) == 0
    assert read_metrics(tmp_path / "o" / METRICS_FILE)[0]["divergence"] > 0
    assert main(["distillation", "--model_name_or_path", student, "--dataset_name", str(data)]) == 2
    assert "--teacher_model_name_or_path is required" in capsys.readouterr().err


def test_loading_flags_reach_the_teacher_under_its_own_kwargs():
    from replayrl.cli.distillation import teacher_loading
    from replayrl.models.model_config import ModelConfig

    flags = ModelConfig(model_name_or_path="s", dtype="bfloat16", attn_implementation="sdpa")
    assert teacher_loading(flags, None) == {"dtype": "bfloat16", "attn_implementation": "sdpa"}
    assert teacher_loading(flags, {"dtype": "float32"}) == {"dtype": "float32", "attn_implementation": "sdpa"}
    assert teacher_loading(ModelConfig(model_name_or_path="s"), None) is None
