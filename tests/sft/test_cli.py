import json

import pytest

from replayrl.cli import COMMANDS, main
from replayrl.cli.common import CLIError
from replayrl.cli.sft import parse_sft_args, run
from replayrl.metrics.plot import panels_for


def test_default_job_runs_and_writes_metrics_and_plot(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["--output_dir", str(out), "--max_steps", "20", "--eval_steps", "20", "--logging_steps", "5"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert any("eval_mean_token_accuracy" in r for r in records)
    assert (out / "training.png").stat().st_size > 0 and (out / "config.json").exists()
    titles = [title for title, _, _ in panels_for(records)]  # SFT's own curves, not GRPO's reward panels
    assert "mean_token_accuracy" in titles and "loss" in titles and "Reward" not in titles
    printed = capsys.readouterr().out
    assert "loss:" in printed and "mean_token_accuracy:" in printed and "held-out sums answered exactly" in printed


def test_command_is_registered_and_flags_parse(tmp_path):
    assert "sft" in COMMANDS
    argv = ["--max_seq_length", "32", "--packing", "true", "--output_dir", str(tmp_path)]
    _, model_args, config = parse_sft_args(argv)
    assert config.max_length == 32 and config.packing and model_args.model_name_or_path is None
    assert config.learning_rate == 3e-3  # the built-in job's default, as no model is given
    *_, config = parse_sft_args(["--model_name_or_path", "m", "--dataset_name", "d", "--output_dir", str(tmp_path)])
    assert config.learning_rate == 2e-5 and config.max_length == 1024  # TRL's defaults


def test_recipe_and_bad_input(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("learning_rate: 1e-4\npacking_strategy: wrapped\n")
    *_, config = parse_sft_args(["--config", str(recipe), "--output_dir", str(tmp_path)])
    assert config.learning_rate == 1e-4 and config.packing_strategy == "wrapped"
    with pytest.raises(CLIError, match="unrecognized arguments: --nope"):
        parse_sft_args(["--nope", "1"])
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "q"}\n')
    args = ["--dataset_name", str(data), "--output_dir", str(tmp_path / "o")]
    assert main(["sft", *args]) == 2
    assert "Cannot tell the dataset's format" in capsys.readouterr().err


def test_help_lists_the_sft_flags(capsys):
    assert main(["sft", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--packing_strategy" in text and "--assistant_only_loss" in text and "--dataset_train_split" in text


def test_local_model_and_jsonl_with_packing(tmp_path, model_dir, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "completion": str(a + 1)}) + "\n" for a in range(12)))
    out = tmp_path / "run"
    argv = ["--model_name_or_path", model_dir, "--dataset_name", str(data), "--output_dir", str(out)]
    argv += ["--max_steps", "2", "--packing", "true", "--max_length", "32", "--logging_steps", "1"]
    argv += ["--dataloader_pin_memory", "false"]
    assert main(["sft", *argv]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum("loss" in r for r in records) == 2 and (out / "model.safetensors").exists()
    assert "held-out" not in capsys.readouterr().out  # only the built-in job has the addition check


def test_example_recipe_parses():
    from pathlib import Path

    recipe = Path(__file__).parents[2] / "examples" / "sft_qwen2_0.5b_capybara.yaml"
    script, model_args, config = parse_sft_args(["--config", str(recipe), "--use_cpu"])  # bf16 needs --use_cpu here
    assert (model_args.model_name_or_path, script.dataset_name) == ("Qwen/Qwen2.5-0.5B", "trl-lib/Capybara")
    assert config.packing and config.max_length == 2048 and config.bf16 and config.learning_rate == 2e-5
    assert config.model_init_kwargs == {"dtype": "bfloat16"}
