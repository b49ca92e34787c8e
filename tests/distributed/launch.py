"""Two CPU processes (gloo) under each sharding strategy, for the trainers' "2 processes == 1 process" workers.

- ``ddp``: DDP, as `tests.conftest.launch_two_processes`.
- ``zero2`` / ``zero3``: DeepSpeed (``DS_ACCELERATOR=cpu``), fp32, from a DeepSpeed config with partitioning forced
  (``stage3_param_persistence_threshold: 0``: every parameter of the tiny models is partitioned, none kept whole).
  The workers' training arguments are ``use_cpu=False, ddp_backend="gloo"`` (`run_settings`): accelerate's CPU
  path ignores DeepSpeed.
- ``fsdp2``: accelerate's FSDP2 (``fully_shard`` per decoder layer), which accelerate 1.15 ignores on CPU: the
  workers let it through with the test-only `tests.grpo.fsdp_worker.force_fsdp_on_cpu` (docs/distributed.md).

Workers call `run_settings()` for their arguments and `full_params()` for the parameters after training (whole
tensors on every process, however they are sharded).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

STRATEGIES = ("zero2", "zero3", "fsdp2")


def deepspeed_config(stage: int) -> dict:
    zero = {"stage": stage}
    if stage == 3:  # partition every parameter, prefetch nothing: the tiny models would otherwise stay whole
        zero.update(stage3_param_persistence_threshold=0, stage3_prefetch_bucket_size=0, stage3_max_live_parameters=0)
        zero.update(stage3_max_reuse_distance=0, stage3_gather_16bit_weights_on_model_save=True)
    auto = {k: "auto" for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")}
    return {"zero_optimization": zero, **auto, "gradient_clipping": "auto", "bf16": {"enabled": False}}


def strategy_flags(strategy: str, out: Path) -> tuple[list[str], dict[str, str]]:
    """`accelerate launch` flags and environment for a strategy."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.update(PYTHONPATH=str(Path(__file__).parents[2]), REPLAYRL_TEST_STRATEGY=strategy)
    env.pop("ACCELERATE_USE_CPU", None)
    flags = ["--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    if strategy in ("zero2", "zero3"):
        config = out / f"ds_{strategy}.json"
        config.write_text(json.dumps(deepspeed_config(int(strategy[-1]))))
        env["DS_ACCELERATOR"] = "cpu"
        return [*flags, "--use_deepspeed", "--deepspeed_config_file", str(config)], env
    env["ACCELERATE_USE_CPU"] = "true"
    if strategy == "fsdp2":
        fsdp = ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"]
        fsdp += ["--fsdp_state_dict_type", "FULL_STATE_DICT", "--fsdp_reshard_after_forward", "true"]
        return [*flags, *fsdp], env
    return [*flags, "--multi_gpu"], env


def launch_strategy(strategy: str, worker: Path, out: Path, port: int, *args: str, timeout: int = 600):
    """`accelerate launch` `worker out *args` on 2 CPU processes under `strategy`; returns `out/result.pt`."""
    out.mkdir(parents=True, exist_ok=True)
    flags, env = strategy_flags(strategy, out)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *flags, "--main_process_port", str(port)]
    proc = subprocess.run(
        [*cmd, str(worker), str(out), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(out / "result.pt", weights_only=False)


# ------------------------------------------------------------------------------------- inside the workers
def strategy() -> str:
    return os.environ.get("REPLAYRL_TEST_STRATEGY", "ddp")


def setup_worker() -> None:
    """One thread; under fsdp2, accelerate's FSDP path let through on CPU (before any trainer is built)."""
    torch.set_num_threads(1)
    if strategy() == "fsdp2":
        from tests.grpo.fsdp_worker import force_fsdp_on_cpu

        force_fsdp_on_cpu()


def run_settings() -> dict:
    """Training arguments for a CPU run under the launched strategy."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false") == "true":
        return dict(use_cpu=False, ddp_backend="gloo")
    return dict(use_cpu=True)


def full_params(model) -> list[torch.Tensor]:
    """The model's parameters as whole CPU tensors on every process (ZeRO-3: gathered; FSDP2: `full_tensor`)."""
    from replayrl.models.sharding import gathered_parameters

    params = list(model.parameters())
    with gathered_parameters(params):
        return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone() for p in params]


def sharding_report(model) -> dict:
    """How the parameters are held on this process: elements held locally vs whole."""
    local = whole = 0
    for p in model.parameters():
        whole += p.ds_numel if hasattr(p, "ds_numel") else p.numel()
        if hasattr(p, "ds_tensor"):
            local += p.ds_tensor.numel()
        elif hasattr(p, "to_local"):
            local += p.to_local().numel()
        else:
            local += p.numel()
    return {"local": local, "whole": whole}
