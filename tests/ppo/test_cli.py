"""`replayrl ppo`: argument resolution, one-line errors, end-to-end runs (local data; the built-in job)."""

import json

import pytest
import torch

from replayrl.cli import COMMANDS, main
from replayrl.cli.ppo import BUILTIN_CONFIG, parse_ppo_args
from replayrl.metrics import METRICS_FILE, PLOT_FILE, read_metrics
from replayrl.models.tiny import save_tiny
from replayrl.models.value_head import AutoModelForCausalLMWithValueHead
from replayrl.tasks import addition


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output_dir runs/ppo-<time> is relative


def test_registered_and_help(capsys):
    assert "ppo" in COMMANDS
    assert main(["ppo", "--help"]) == 0
    assert "--kl_penalty" in capsys.readouterr().out


def test_builtin_settings_only_without_model_and_dataset(tmp_path):
    *_, config = parse_ppo_args([])
    assert config.batch_size == BUILTIN_CONFIG["batch_size"] and config.output_dir.startswith("runs/ppo-")
    *_, config = parse_ppo_args(["--model_name_or_path", "x", "--batch_size", "8", "--log_with", "none"])
    assert config.batch_size == 8 and config.learning_rate == 1e-5 and config.log_with is None
    (tmp_path / "r.yaml").write_text("learning_rate: 1e-4\ncliprange: 0.1\n")
    *_, config = parse_ppo_args(["--config", str(tmp_path / "r.yaml"), "--cliprange", "0.3"])
    assert config.learning_rate == 1e-4 and config.cliprange == 0.3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ppo", "--batch_size", "10", "--mini_batch_size", "4"], "not divisible"),
        (["ppo", "--no_such_flag", "1"], "unrecognized arguments"),
        (["ppo", "--dataset_name", "missing.jsonl"], "reward_funcs is required"),
        (["ppo", "--kl_penalty", "k9"], "invalid choice"),
    ],
)
def test_bad_arguments_print_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("replayrl: error:") and message in err and "\n" not in err


def test_end_to_end_local_jsonl(tmp_path, capsys):
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model_dir = save_tiny(tmp_path / "tiny", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    out = tmp_path / "run"
    argv = ["ppo", "--model_name_or_path", model_dir, "--dataset_name", str(tmp_path / "data.jsonl")]
    argv += ["--prompt_column", "question", "--reward_funcs", "exact_match", "length:3", "--output_dir", str(out)]
    argv += ["--steps", "16", "--batch_size", "8", "--mini_batch_size", "4", "--max_new_tokens", "3"]
    argv += ["--save_steps", "1", "--learning_rate", "1e-3"]
    with torch.random.fork_rng(devices=[]):
        assert main(argv) == 0
    records = read_metrics(out / METRICS_FILE)
    assert [r["step"] for r in records] == [1, 2] and "rewards/exact_match/mean" in records[0]
    assert (out / PLOT_FILE).is_file() and (out / "checkpoint-2").is_dir()
    AutoModelForCausalLMWithValueHead.from_pretrained(str(out))
    assert "PPO steps" in capsys.readouterr().out
    # resuming a finished run continues from its last checkpoint and does nothing more
    assert main(argv + ["--resume_from_checkpoint", "true"]) == 0
    assert [r["step"] for r in read_metrics(out / METRICS_FILE)] == [1, 2]


@pytest.mark.slow
def test_builtin_job_short(tmp_path, capsys, monkeypatch):
    warm_up = addition.warm_up  # a short warm-up: this test checks the job's plumbing, not its curve
    monkeypatch.setattr(addition, "warm_up", lambda model, tokenizer, seed: warm_up(model, tokenizer, seed, steps=20))
    out = tmp_path / "builtin"
    argv = ["ppo", "--steps", "32", "--batch_size", "16", "--mini_batch_size", "8", "--output_dir", str(out)]
    assert main(argv) == 0
    summary = capsys.readouterr().out
    assert "built-in job" in summary and "held-out reward" in summary
    assert [r["step"] for r in read_metrics(out / METRICS_FILE)] == [2]  # logging_steps 5: the last step
