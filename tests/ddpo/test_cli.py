import sys

import pytest

from replayrl.cli import main
from replayrl.metrics import read_metrics

pytest.importorskip("diffusers")

FAST = ["--sample_batch_size", "4", "--train_batch_size", "4", "--sample_num_steps", "2"]


def test_builtin_job_writes_metrics_plot_sample_grids_and_weights(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["ddpo", "--num_epochs", "2", "--save_freq", "1", "--logdir", "run", *FAST]) == 0
    run = tmp_path / "run"
    rewards = [r["reward_mean"] for r in read_metrics(run / "metrics.jsonl") if "reward_mean" in r]
    assert len(rewards) == 2
    assert (run / "training.png").stat().st_size > 0
    from PIL import Image

    grid = Image.open(run / "samples" / "epoch-1.png")
    assert grid.size == (8 * 64 + 7 * 2, 64)  # 2 batches of 4 images of 16 px shown 4x, 2-px gaps
    assert (run / "final" / "model_index.json").is_file()  # the built-in job trains the full UNet
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    out = capsys.readouterr().out
    assert "reward_mean:" in out and "samples:" in out


def test_builtin_job_is_sgd_with_momentum_on_redness():
    from replayrl.cli.ddpo import BUILTIN_VAE_NORM_GROUPS, parse_args

    args, config = parse_args(["--logdir", "run"])
    assert args.reward == "redness" and BUILTIN_VAE_NORM_GROUPS == 1 and not args.use_lora and config.seed == 0
    # Adam's epsilon far above the gradients (RMS ~1e-3): the step is lr / eps x the momentum-averaged gradient
    assert config.train_adam_epsilon == 1.0 and config.train_learning_rate == 0.2
    assert config.sample_batch_size * config.sample_num_batches_per_epoch == 32
    assert config.train_batch_size * config.train_gradient_accumulation_steps == 32  # one optimizer step per epoch
    assert parse_args(["--pretrained_model", "x", "--logdir", "run"])[1].train_adam_epsilon == 1e-8  # TRL's default


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sample_batch_size", "3", "--train_batch_size", "2"], "not a multiple of train_batch_size=2"),
        (["--reward", "nope"], "unknown reward 'nope'"),
        (["--no_such_flag", "1"], "unrecognized arguments"),
        (["--use_lora", "maybe"], "Truthy value expected"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(["ddpo", "--logdir", "run", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_missing_diffusers_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "diffusers", None)  # import diffusers -> ImportError
    assert main(["ddpo"]) == 2
    assert "pip install replayrl[diffusers]" in capsys.readouterr().err
