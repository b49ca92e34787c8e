"""The `replayrl` command line: argument resolution (defaults < built-in job < recipe < flags), one-line
errors with exit status 2, --help, and short end-to-end runs that write a loadable model, metrics and a plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset, DatasetDict
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerControl, TrainerState, TrainingArguments

from replayrl.cli import COMMANDS, main
from replayrl.cli.common import CLIError
from replayrl.cli.common import load_any_dataset as load_prompt_dataset
from replayrl.cli.grpo import parse_grpo_args, prepare_prompts
from replayrl.metrics import METRICS_FILE, PLOT_FILE, read_metrics
from replayrl.metrics.callback import MetricsFileCallback
from replayrl.models.tiny import build_tiny_model, build_tokenizer, save_tiny
from replayrl.tasks import addition as default_task

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "qwen2_0.5b_math_boxed.yaml"


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    # The default output_dir is relative (runs/grpo-<time>): keep anything a test creates out of the repo.
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def one_thread():
    # Tiny models run faster on one thread, especially on a busy 2-core machine (see default_task.one_thread).
    with default_task.one_thread():
        yield


def write_yaml(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.fixture
def data_file(tmp_path) -> str:
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(3)]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# ---------------------------------------------------------------------------------------------- resolution
def test_recipe_values_are_defaults_and_flags_override_them(tmp_path):
    recipe = write_yaml(
        tmp_path / "r.yaml",
        # 1e-4 is a *string* to PyYAML; a dashed key; a scalar for a list flag.
        "learning_rate: 1e-4\nnum-generations: 4\nlogging_steps: 3\nreward_funcs: length:5\nbf16: 'no'\n",
    )
    script, _, config = parse_grpo_args(["--config", recipe, "--learning_rate", "2e-4"])
    assert config.learning_rate == 2e-4  # flag beats recipe
    assert config.num_generations == 4 and config.logging_steps == 3 and config.bf16 is False  # recipe beats defaults
    assert script.reward_funcs == ["length:5"]
    # untouched values: the built-in job's settings (no model, no dataset), then the CLI's own defaults
    assert config.max_steps == default_task.DEFAULT_CONFIG["max_steps"]
    assert config.report_to == [] and config.output_dir.startswith("runs/grpo-")


def test_builtin_job_settings_only_without_model_and_dataset(tmp_path):
    *_, builtin = parse_grpo_args([])
    assert builtin.learning_rate == default_task.DEFAULT_CONFIG["learning_rate"]
    recipe = write_yaml(tmp_path / "r.yaml", "model_name_or_path: some/model\n")
    for argv in (["--dataset_name", "d.jsonl"], ["--model-name-or-path", "m"], ["--config", recipe]):
        _, model_args, config = parse_grpo_args(argv)
        assert config.learning_rate == 1e-6 and config.max_steps == -1, argv  # GRPOConfig's own defaults
    assert model_args.model_name_or_path == "some/model"


def test_example_recipe_parses():
    # The recipe asks for bf16, which a CPU-only machine refuses unless told to use the CPU.
    script, model_args, config = parse_grpo_args(["--config", str(RECIPE), "--use_cpu"])
    assert model_args.model_name_or_path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (script.dataset_name, script.dataset_config, script.prompt_column) == ("openai/gsm8k", "main", "question")
    assert script.reward_funcs == ["boxed"] and "boxed" in script.system_prompt
    assert config.bf16 and config.replay_buffer_size == 64 and config.num_generations == 8
    assert config.generation_batch_size % config.num_generations == 0


# ---------------------------------------------------------------------------------------------- errors
BAD_ARGS = {
    "unknown flag": ["grpo", "--no_such_flag", "1"],
    "bad float": ["grpo", "--learning_rate", "abc"],
    "bad choice": ["grpo", "--loss_type", "ppo"],
    "bad bool": ["grpo", "--bf16", "maybe"],
    "missing recipe": ["grpo", "--config", "missing.yaml"],
    "config ValueError": ["grpo", "--num_generations", "1"],
    "bad reward spec": ["grpo", "--reward_funcs", "no_such_reward"],
    "missing data file": ["grpo", "--dataset_name", "missing.jsonl", "--reward_funcs", "exact_match"],
    "no reward for a dataset": ["grpo", "--dataset_name", "{data}"],
    "missing test split": "grpo --dataset_name {tmp}/dd --reward_funcs exact_match --prompt_column q "
    "--eval_on_start".split(),
    "missing reward column": "grpo --dataset_name {tmp}/saved --reward_funcs exact_match --prompt_column q".split(),
    "missing tracker package": ["grpo", "--report_to", "dvclive"],
    "resume with nothing to resume": ["grpo", "--resume_from_checkpoint", "true", "--output_dir", "{tmp}/none"],
    "resume from a missing path": ["grpo", "--resume_from_checkpoint", "{tmp}/none/checkpoint-9"],
    "output_dir holds an old run": ["grpo", "--output_dir", "{tmp}/old"],
    "bad reward module": ["grpo", "--reward_funcs", "no_such_module.accuracy"],
    "peft flag error": ["grpo", "--use_peft", "--lora_r", "0"],
    "missing prompt column": ["grpo", "--dataset_name", "{data}", "--reward_funcs", "exact_match"],
    "missing model": "grpo --model_name_or_path {tmp}/no-model --dataset_name {data} --prompt_column question "
    "--reward_funcs exact_match --output_dir {tmp}/out".split(),
    "recipe: unknown key": ["grpo", "--config", "{tmp}/unknown.yaml"],
    "recipe: bad value": ["grpo", "--config", "{tmp}/bad_value.yaml"],
    "recipe: not a mapping": ["grpo", "--config", "{tmp}/list.yaml"],
    "no command": [],
    "unknown command": ["train"],
    "plot: no metrics": ["plot", "{tmp}"],
    "plot: unknown flag": ["plot", "{tmp}", "--dpi", "3"],
}


@pytest.mark.parametrize("case", list(BAD_ARGS))
def test_bad_arguments_print_one_line_and_exit_2(case, tmp_path, data_file, capsys):
    write_yaml(tmp_path / "unknown.yaml", "learning_rat: 1e-4\n")
    write_yaml(tmp_path / "bad_value.yaml", "learning_rate: fast\n")
    write_yaml(tmp_path / "list.yaml", "- learning_rate\n")
    Dataset.from_dict({"q": ["1+1="] * 8}).save_to_disk(str(tmp_path / "saved"))  # no 'answer' column
    DatasetDict({"train": Dataset.from_dict({"q": ["1+1="] * 8})}).save_to_disk(str(tmp_path / "dd"))  # no 'test'
    capsys.readouterr()  # drop the save's progress bar
    (tmp_path / "old" / "checkpoint-2").mkdir(parents=True)
    argv = [a.format(tmp=tmp_path, data=data_file) for a in BAD_ARGS[case]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("replayrl: error: ") and "\n" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv", [["--help"], ["grpo", "--help"], ["plot", "--help"], ["--version"]])
def test_help(argv, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    if argv == ["grpo", "--help"]:
        for flag in ("--model_name_or_path", "--reward_funcs", "--config", "--replay_buffer_size", "--beta"):
            assert flag in out
        assert "examples:" in out


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_registered_command_is_listed_and_answers_help(command, capsys):
    """A subcommand is its module plus its `COMMANDS` entry: nothing else lists it."""
    assert main(["--help"]) == 0 and f"  {command} " in capsys.readouterr().out
    assert main([command, "--help"]) == 0
    assert f"usage: replayrl {command}" in capsys.readouterr().out


def test_help_is_concise_grouped_and_shows_the_library_defaults(capsys):
    assert main(["grpo", "--help"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) < 400 and "--no_" not in out  # 651 lines before it was grouped
    for title in ("data and rewards:", "model (ModelConfig):", "generation:", "GRPO loss:", "replay buffer:"):
        assert title in out
    max_steps_help = out.split("--max_steps MAX_STEPS")[1].split("\n  --")[0]
    assert "(default: -1)" in " ".join(max_steps_help.split())  # GRPOConfig's, not the built-in job's 500
    for flag in ("--use_peft", "--lora_target_modules", "--dtype", "--attn_implementation", "--trust_remote_code"):
        assert flag in out
    assert "--help_all" in out and "--adam_beta1" not in out
    assert main(["grpo", "--help_all"]) == 0
    assert "--adam_beta1" in capsys.readouterr().out


def test_reward_functions_by_dotted_path_from_the_current_directory(tmp_path):
    from replayrl.cli.grpo import resolve_rewards

    (tmp_path / "my_rewards.py").write_text("def accuracy(completions, **kw):\n    return [1.0] * len(completions)\n")
    dotted, colon, model = resolve_rewards(["my_rewards.accuracy", "my_rewards:accuracy"], "some/rm", False)
    assert dotted is colon and dotted.__name__ == "accuracy" and model == "some/rm"


def test_model_flags_reach_the_loader_and_peft():
    from peft import LoraConfig

    from replayrl.models.model_config import get_peft_config, model_init_kwargs

    argv = ["--model_name_or_path", "m", "--dtype", "bfloat16", "--attn_implementation", "eager"]
    argv += ["--trust_remote_code", "--use_peft", "--lora_r", "4", "--lora_target_modules", "all-linear"]
    _, model_args, _ = parse_grpo_args(argv + ["--dataset_name", "d.jsonl"])
    kwargs = model_init_kwargs(model_args)
    assert kwargs["dtype"] == "bfloat16" and kwargs["attn_implementation"] == "eager" and kwargs["trust_remote_code"]
    lora = get_peft_config(model_args)
    assert isinstance(lora, LoraConfig) and lora.r == 4 and lora.target_modules == "all-linear"


def test_python_dash_m(tmp_path):
    out = subprocess.run([sys.executable, "-m", "replayrl", "train"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().startswith("replayrl: error: unknown command")


# ---------------------------------------------------------------------------------------------- runs
def check_run_dir(out: Path) -> list[dict]:
    records = read_metrics(out / METRICS_FILE)
    assert records and all("step" in r for r in records)
    assert any("reward" in r and "frac_reward_zero_std" in r for r in records)
    assert (out / PLOT_FILE).stat().st_size > 10_000
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == len(tokenizer)
    return records


def test_end_to_end_local_jsonl(tmp_path, data_file, capsys, one_thread):
    model_dir = save_tiny(tmp_path / "tiny", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    out = tmp_path / "run"
    argv = ["grpo", "--model_name_or_path", model_dir, "--dataset_name", data_file, "--prompt_column", "question"]
    argv += ["--reward_funcs", "exact_match", "length:3", "--reward_weights", "1", "0.1", "--output_dir", str(out)]
    argv += ["--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "4"]
    argv += ["--max_completion_length", "4", "--logging_steps", "1", "--save_steps", "1", "--disable_tqdm", "true"]
    assert main(argv) == 0
    records = check_run_dir(out)
    assert [r["step"] for r in records if "reward" in r] == [1, 2]
    assert (out / "checkpoint-2").is_dir()
    summary = capsys.readouterr().out
    assert "reward:" in summary and str(out / PLOT_FILE) in summary
    # `replayrl plot` re-draws the figure from metrics.jsonl alone
    (out / PLOT_FILE).unlink()
    assert main(["plot", str(out)]) == 0 and (out / PLOT_FILE).exists()


def test_end_to_end_builtin_default_job(tmp_path, capsys):
    threads = torch.get_num_threads()
    out = tmp_path / "default"
    assert main(["grpo", "--max_steps", "2", "--logging_steps", "1", "--output_dir", str(out)]) == 0
    assert torch.get_num_threads() == threads  # the built-in job's one-thread setting is undone
    records = check_run_dir(out)
    assert any("eval_reward" in r for r in records)  # evaluated on the held-out prompts
    assert any("replay/buffer_size" in r for r in records)
    assert "built-in default job" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- pieces
def test_saved_dataset_folder_split_and_system_prompt(tmp_path):
    rows = {"question": ["1+1=", "2+2="], "answer": ["2", "4"]}
    DatasetDict({"train": Dataset.from_dict(rows), "test": Dataset.from_dict(rows)}).save_to_disk(tmp_path / "ds")
    test = load_prompt_dataset(str(tmp_path / "ds"), None, "test")
    with pytest.raises(CLIError, match="no split 'validation'"):
        load_prompt_dataset(str(tmp_path / "ds"), None, "validation")
    chat = prepare_prompts(test, "question", system_prompt="Answer with a number.")
    assert chat.column_names == ["prompt", "answer"]
    assert chat[0]["prompt"] == [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "1+1="},
    ]


def test_default_task_data_and_teacher():
    train, held_out = default_task.task_datasets(seed=0)
    assert len(train) == 100 - default_task.HELD_OUT and len(held_out) == default_task.HELD_OUT
    assert not set(train["prompt"]) & set(held_out["prompt"])
    examples = default_task.teacher_examples(seed=0)
    by_prompt: dict[str, list[str]] = {}
    for prompt, answer in examples:
        by_prompt.setdefault(prompt, []).append(answer)
    for prompt, answers in by_prompt.items():
        a, b = map(int, prompt.rstrip("=").split("+"))
        assert len(answers) == default_task.WARMUP_SAMPLES and 1 <= answers.count(str(a + b)) <= 3
    assert default_task.teacher_examples(seed=0) == examples


def test_warm_up_is_deterministic(one_thread):
    tokenizer = build_tokenizer()
    states = []
    for _ in range(2):
        model = build_tiny_model(tokenizer, seed=0, **default_task.MODEL_KWARGS)
        default_task.warm_up(model, tokenizer, seed=0, steps=3)
        states.append(model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_metrics_file_keeps_lines_up_to_the_resumed_step(tmp_path):
    path = tmp_path / METRICS_FILE
    callback = MetricsFileCallback(path)
    args, control = TrainingArguments(output_dir=str(tmp_path), report_to="none"), TrainerControl()
    state = TrainerState()
    callback.on_train_begin(args, state, control)
    for step in range(1, 6):
        state.global_step = step
        callback.on_log(args, state, control, logs={"reward": 0.1 * step, "kl": float("nan")})
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4, 5]
    assert read_metrics(path)[0]["kl"] is None  # strict JSON: NaN -> null
    state.global_step = 3  # resumed from checkpoint-3
    callback.on_train_begin(args, state, control)
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
