"""`replayrl kto`: the built-in offline job runs end to end (short), a user file of unpaired rows works."""

from __future__ import annotations

import json

import pytest

from replayrl.cli import main
from replayrl.metrics import METRICS_FILE, PLOT_FILE, read_metrics


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_builtin_job_runs_and_writes_metrics_and_plot(tmp_path, capsys, fast_warm_up):
    out = tmp_path / "kto"
    assert main(["kto", "--output_dir", str(out), "--max_steps", "4", "--logging_steps", "2", "--eval_steps", "2"]) == 0
    records = read_metrics(out / METRICS_FILE)
    assert any("rewards/margins" in r for r in records) and any("eval_rewards/margins" in r for r in records)
    assert (out / PLOT_FILE).is_file() and (out / "config.json").is_file()
    printed = capsys.readouterr().out
    assert "replayrl kto: built-in job" in printed and "rewards/margins: " in printed


def test_user_file_of_unpaired_rows(tmp_path, capsys):
    from replayrl.models.tiny import save_tiny

    model = save_tiny(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    data = tmp_path / "thumbs.jsonl"
    rows = [{"prompt": f"{a}+1=", "completion": str(a + 1 + a % 2), "label": a % 2 == 0} for a in range(8)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["kto", "--model_name_or_path", model, "--dataset_name", str(data), "--max_steps", "1", "--logging_steps",
            "1", "--per_device_train_batch_size", "4", "--bf16", "false"]  # fmt: skip
    argv += ["--output_dir", str(tmp_path / "o")]
    assert main(argv) == 0
    assert "rewards/chosen" in read_metrics(tmp_path / "o" / METRICS_FILE)[0]
    assert main(["kto", "--loss_type", "bco"]) == 2
    assert "loss_type must be one of" in capsys.readouterr().err
