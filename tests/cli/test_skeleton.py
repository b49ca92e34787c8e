"""The shared CLI skeleton (replayrl.cli.common): one flag per shared field, TRL's flag aliases, and runs without
the `plot` extra (matplotlib) still writing metrics.jsonl and saying the plot was skipped."""

from __future__ import annotations

import sys

import pytest

from replayrl.cli import main
from replayrl.cli.common import ModelArguments, ScriptArguments, parse_command
from replayrl.cli.grpo import parse_grpo_args
from replayrl.metrics import METRICS_FILE, PLOT_FILE, read_metrics


def test_a_field_of_two_dataclasses_is_one_flag_given_to_both(tmp_path):
    _, model_args, config = parse_grpo_args(["--trust_remote_code", "true", "--output_dir", str(tmp_path)])
    assert model_args.trust_remote_code is True and config.trust_remote_code is True
    _, model_args, config = parse_grpo_args(["--use_peft", "--lora_r", "4", "--output_dir", str(tmp_path)])
    assert model_args.trust_remote_code is False and config.trust_remote_code is False
    assert model_args.use_peft and model_args.lora_r == 4  # ModelConfig's own __post_init__ ran on the values
    with pytest.raises(Exception, match="lora_r must be >= 1"):
        parse_grpo_args(["--lora_r", "0", "--output_dir", str(tmp_path)])


def test_dataset_split_is_an_alias_of_dataset_train_split(tmp_path):
    from replayrl.dpo import DPOConfig

    types = (ScriptArguments, ModelArguments, DPOConfig)
    for flag in ("--dataset_split", "--dataset_train_split", "--dataset-split"):
        script, _, config = parse_command("dpo", types, [flag, "dev", "--output_dir", str(tmp_path)], {})
        assert script.dataset_train_split == "dev" and config.report_to == []


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # import matplotlib -> ImportError


def test_plot_without_matplotlib_is_one_line_naming_the_extra(tmp_path, capsys, no_matplotlib):
    (tmp_path / METRICS_FILE).write_text('{"step": 1, "loss": 1.0}\n')
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "pip install 'replayrl[plot]'" in err and err.count("\n") == 1


def test_a_run_without_matplotlib_writes_metrics_and_skips_the_plot(tmp_path, capsys, no_matplotlib):
    out = tmp_path / "run"
    argv = ["reward", "--output_dir", str(out), "--max_steps", "2", "--logging_steps", "1", "--eval_strategy", "no"]
    assert main([*argv, "--eval_on_start", "false"]) == 0
    assert [r["step"] for r in read_metrics(out / METRICS_FILE) if "loss" in r] == [1, 2]
    assert not (out / PLOT_FILE).exists()
    assert "plot: skipped: plotting needs matplotlib: pip install 'replayrl[plot]'" in capsys.readouterr().out


# what each command needs beyond the model and LoRA flags: its rows, and its own flags
ROWS_AND_FLAGS = {
    "sft": (lambda a: {"prompt": f"{a}+1=", "completion": str(a + 1)}, []),
    "dpo": (lambda a: {"prompt": f"{a}+1=", "chosen": str(a + 1), "rejected": "x"}, []),
    "kto": (lambda a: {"prompt": f"{a}+1=", "completion": str(a + 1), "label": a % 2 == 0}, ["--bf16", "false"]),
    "rloo": (lambda a: {"prompt": f"{a}+1="}, ["--reward_funcs", "length", "--max_completion_length", "4", "--bf16",
                                              "false"]),
    "distillation": (lambda a: {"prompt": f"{a}+1="}, ["--max_completion_length", "4", "--bf16", "false"]),
}  # fmt: skip


@pytest.mark.parametrize("command", list(ROWS_AND_FLAGS))
def test_model_config_flags_reach_the_trainer(tmp_path, model_dir, command):
    """--use_peft / --lora_r (ModelConfig) train a LoRA adapter; --dtype reaches from_pretrained. The flags of TRL's
    `trl <command>` scripts, which all take ModelConfig."""
    import json

    row, flags = ROWS_AND_FLAGS[command]
    if command == "distillation":
        flags = [*flags, "--teacher_model_name_or_path", model_dir]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row(a)) + "\n" for a in range(8)))
    out = tmp_path / "run"
    argv = [command, "--model_name_or_path", model_dir, "--dataset_name", str(data), "--output_dir", str(out), *flags]
    argv += ["--max_steps", "1", "--per_device_train_batch_size", "4", "--use_peft", "--lora_r", "4"]
    argv += ["--lora_target_modules", "q_proj", "v_proj", "--dtype", "float32", "--dataloader_pin_memory", "false"]
    assert main(argv) == 0
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert read_metrics(out / METRICS_FILE)
