"""`replayrl rloo`: the built-in offline job runs end to end (short), a user dataset works, bad input is one line."""

from __future__ import annotations

import pytest

from replayrl.cli import main
from replayrl.metrics import METRICS_FILE, PLOT_FILE, read_metrics


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_builtin_job_runs_and_writes_metrics_and_plot(tmp_path, capsys, fast_warm_up):
    out = tmp_path / "rloo"
    argv = ["rloo", "--output_dir", str(out), "--max_steps", "4", "--logging_steps", "2", "--eval_steps", "2",
            "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "40"]  # fmt: skip
    assert main(argv) == 0
    records = read_metrics(out / METRICS_FILE)
    assert any("reward" in r and "kl" in r for r in records) and any("eval_reward" in r for r in records)
    assert (out / PLOT_FILE).is_file() and (out / "config.json").is_file()
    printed = capsys.readouterr().out
    assert "replayrl rloo: built-in job" in printed and "reward: " in printed


def test_user_dataset_and_reward(tmp_path):
    from replayrl.models.tiny import save_tiny

    model = save_tiny(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(f'{{"question": "{a}+1="}}\n' for a in range(8)))
    argv = ["rloo", "--model_name_or_path", model, "--dataset_name", str(data), "--prompt_column", "question",
            "--reward_funcs", "length", "--max_steps", "1", "--per_device_train_batch_size", "4",
            "--max_completion_length", "4", "--logging_steps", "1", "--bf16", "false",
            "--output_dir", str(tmp_path / "o")]  # fmt: skip
    assert main(argv) == 0
    assert any(k.startswith("rewards/") for k in read_metrics(tmp_path / "o" / METRICS_FILE)[0])


def test_bad_input_is_one_line(capsys):
    assert main(["rloo", "--loss_type", "dapo"]) == 2
    assert "Leave loss_type at 'grpo'" in capsys.readouterr().err
    assert main(["rloo", "--dataset_name", "x.jsonl"]) == 2
    assert "--reward_funcs is required" in capsys.readouterr().err
