"""`replayrl dpo` and `replayrl reward`: the built-in offline jobs run end to end (short), bad input is one line."""

from __future__ import annotations

import pytest

from replayrl.cli import main
from replayrl.metrics import METRICS_FILE, PLOT_FILE, read_metrics
from replayrl.tasks import addition
from replayrl.tasks.preferences import STRAY, preference_datasets


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("command", "metric"), [("dpo", "rewards/accuracies"), ("reward", "accuracy")])
def test_builtin_job_runs_and_writes_metrics_and_plot(tmp_path, capsys, monkeypatch, command, metric):
    # The job as it is, but a 10-step warm-up of the policy instead of 300 (the slowest part on a busy machine).
    real_warm_up = addition.warm_up
    monkeypatch.setattr(addition, "warm_up", lambda model, tok, seed: real_warm_up(model, tok, seed, steps=10))
    out = tmp_path / command
    argv = [command, "--output_dir", str(out), "--max_steps", "4", "--logging_steps", "2", "--eval_steps", "2"]
    assert main(argv) == 0
    records = read_metrics(out / METRICS_FILE)
    assert any(metric in r for r in records) and any(f"eval_{metric}" in r for r in records)
    assert (out / PLOT_FILE).is_file() and (out / "config.json").is_file()
    printed = capsys.readouterr().out
    assert f"replayrl {command}: built-in job" in printed
    assert f"{metric}: " in printed and " -> " in printed


@pytest.mark.parametrize("command", ["dpo", "reward"])
def test_bad_flags_are_one_line_errors(capsys, command):
    assert main([command, "--no_such_flag", "1"]) == 2
    assert "unrecognized arguments: --no_such_flag" in capsys.readouterr().err
    assert main([command, "--dataset_name", "x.jsonl", "--eval_strategy", "steps"]) == 2
    assert "no --dataset_test_split" in capsys.readouterr().err


def test_dpo_bad_loss_type_is_one_line(capsys):
    assert main(["dpo", "--loss_type", "sigmod"]) == 2
    assert "valid loss types are" in capsys.readouterr().err


def test_dpo_user_dataset_file(tmp_path, capsys):
    from replayrl.models.tiny import save_tiny

    model = save_tiny(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join(f'{{"chosen": "{a}+1={a + 1}", "rejected": "{a}+1={a + 2}"}}\n' for a in range(8)))
    argv = ["dpo", "--model_name_or_path", model, "--dataset_name", str(data), "--max_steps", "2"]
    argv += ["--per_device_train_batch_size", "4", "--output_dir", str(tmp_path / "o"), "--loss_type", "ipo", "hinge"]
    assert main(argv) == 0
    assert read_metrics(tmp_path / "o" / METRICS_FILE)[0]["loss/ipo"] > 0


def test_builtin_preferences_hold_out_unseen_prompts_and_follow_the_rule():
    train, held_out = preference_datasets(seed=0, per_problem=4)
    assert len(train) == 80 * 4 and len(held_out) == addition.HELD_OUT * 4
    assert not set(train["prompt"]) & set(held_out["prompt"])  # held-out prompts never trained on
    for row in list(train) + list(held_out):
        a, b = row["prompt"].rstrip("=").split("+")
        assert row["chosen"] == str(int(a) + int(b))
        stripped = row["rejected"].strip(STRAY)
        assert row["rejected"] != row["chosen"]
        assert stripped == row["chosen"] or row["rejected"] == f"{row['chosen']} {row['chosen']}"
    near, _ = preference_datasets(seed=0, per_problem=2, rejected="near_miss")
    assert all(abs(int(r["rejected"]) - int(r["chosen"])) in (1, 2) for r in near)
    with pytest.raises(ValueError, match="rejected='typo' is not a kind of pair"):
        preference_datasets(rejected="typo")


@pytest.mark.slow
@pytest.mark.parametrize(("command", "metric"), [("reward", "eval_accuracy"), ("dpo", "eval_rewards/accuracies")])
def test_builtin_job_as_it_is_reaches_095_on_held_out_pairs(tmp_path, command, metric):
    """The default job, unchanged (seed 0): the issues' bar of >= 0.95 held-out accuracy (docs: seeds 0-2)."""
    assert main([command, "--output_dir", str(tmp_path / command)]) == 0
    values = [r[metric] for r in read_metrics(tmp_path / command / METRICS_FILE) if metric in r]
    assert values[0] < 0.7 and values[-1] >= 0.95
