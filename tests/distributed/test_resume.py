"""Exact resume of every trainer under DeepSpeed ZeRO-2, ZeRO-3 and FSDP2 with two CPU processes (gloo): GRPO, GRPO
with replay, RLOO, SFT, reward, DPO, KTO, distillation (tests/distributed/resume.py) and PPO
(tests/ppo/dist_resume.py). Each runs 4 steps writing checkpoint-2 on its way; a new trainer resumed from
checkpoint-2 trains to step 4; its logged metrics (rel 1e-5) and final parameters (rtol 1e-5, atol 1e-7) equal the
uninterrupted run's, and the parameters moved from the start.

One `accelerate launch` per strategy runs all nine resumes in turn (tests/distributed/worker.py). Not in the default
run (marker `distributed_resume`, deselected in pyproject.toml for time): `.ci/run` runs them after the main suite,
`python -m pytest -q -m distributed_resume tests/distributed/test_resume.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import deepspeed_config, launch_strategy, strategy_flags
from tests.distributed.test_strategies import DEEPSPEED, assert_sharded
from tests.distributed.worker import RESUME_TRAINERS, RESUMES

pytestmark = pytest.mark.distributed_resume

WORKER = Path(__file__).with_name("worker.py")
PORTS = {"zero2": 29681, "zero3": 29683, "fsdp2": 29685}


@pytest.fixture(scope="module", params=["zero2", "zero3", "fsdp2"])
def resumed(request, tmp_path_factory) -> tuple[str, dict]:
    strategy = request.param
    if strategy in DEEPSPEED:
        pytest.importorskip("deepspeed", reason="DeepSpeed runs need `pip install replayrl[deepspeed]`")
    out = tmp_path_factory.mktemp(f"resume-{strategy}")
    return strategy, launch_strategy(strategy, WORKER, out, PORTS[strategy], *(f.__name__ for f in RESUMES))


@pytest.mark.parametrize("name", RESUME_TRAINERS)
def test_resume_is_exact(resumed, name):
    """A transformers-Trainer trainer: the resumed run logs the same metrics at steps 1-4 and ends with the same
    parameters as the run that was not interrupted; the checkpoint holds both ranks' state files and the marker,
    under DeepSpeed both ranks' optimizer partitions (`global_step2/`), under FSDP2 the gathered model; GRPO with
    replay: the same final buffer, not empty."""
    strategy, results = resumed
    result = results[f"{name}_resume"]
    assert_sharded(strategy, result["sharding"])
    resumed_logs, straight = result["resumed_logs"], result["straight_logs"]
    assert [h["step"] for h in resumed_logs] == [h["step"] for h in straight] == [1, 2, 3, 4]
    for a, b in zip(resumed_logs, straight):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (a["step"], key)
    for a, b in zip(result["resumed"], result["straight"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert not all(torch.equal(a, b) for a, b in zip(result["initial"], result["resumed"], strict=True))  # trained
    files = result["checkpoint"]
    assert {"replayrl_complete.json", "replayrl_state_rank0.json", "replayrl_state_rank1.json"} <= set(files), files
    if strategy in DEEPSPEED:
        assert sum(f.startswith("global_step2/") and f.endswith("optim_states.pt") for f in files) == 2, files
    else:
        assert "model.safetensors" in files, files
    if name == "grpo_replay":
        final_resumed, final_straight = result["buffers"]
        assert final_resumed and final_resumed == final_straight


def test_ppo_resume_is_exact(resumed):
    """PPOTrainer.train() resumed from checkpoint-2 to step 4 in a new trainer: parameters (rtol 1e-5), KL
    coefficient and the metrics of steps 3-4 (rel 1e-5) equal the uninterrupted run's. Under DeepSpeed the engine's
    own checkpoint (model and optimizer partitions) is in checkpoint-2 beside the gathered model; under FSDP2 each
    rank's state file holds its shard of Adam's moments (about half of them)."""
    strategy, results = resumed
    result = results["ppo_resume"]
    assert_sharded(strategy, result["sharding"])
    for a, b in zip(result["full"], result["resumed"], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
    assert not all(torch.equal(a, b) for a, b in zip(result["initial"], result["resumed"], strict=True))  # trained
    assert result["kl"][0] == pytest.approx(result["kl"][1], rel=1e-5)
    whole, resumed_metrics = result["metrics"]
    assert [r["step"] for r in whole] == [1, 2, 3, 4] and [r["step"] for r in resumed_metrics] == [3, 4]
    for a, b in zip(whole[2:], resumed_metrics):
        for key in ("ppo/loss/total", "reward", "objective/kl"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    files = result["checkpoint"]
    assert "full/checkpoint-2/model.safetensors" in files and "full/checkpoint-2/replayrl_complete.json" in files
    if strategy in DEEPSPEED:
        assert any(f.startswith("full/checkpoint-2/global_step2/") for f in files), files
        assert result["optimizer_files"] == [None, None]
    else:  # FSDP2: sharded moments (exp_avg, exp_avg_sq) of every parameter, about half on each rank
        moments = 2 * sum(p.numel() for p in result["full"])
        for report in result["optimizer_files"]:
            assert report["dtensors"] > 0 and report["elements"] <= 0.55 * moments, (report, moments)


def zero_cpu_variant(stage: int, tmp_path: Path) -> Path:
    """examples/accelerate/deepspeed_zero{stage}.yaml for this machine: 2 processes, fp32, and the DeepSpeed
    settings from a config file that forces partitioning (`launch.deepspeed_config`)."""
    import yaml

    from tests.grpo.test_fsdp import CONFIGS

    config = yaml.safe_load((CONFIGS / f"deepspeed_zero{stage}.yaml").read_text())
    ds_file = tmp_path / f"ds_zero{stage}.json"
    ds_file.write_text(json.dumps(deepspeed_config(stage)))
    config.update(num_processes=2)
    config.pop("mixed_precision")  # the DeepSpeed config file says fp32 (accelerate refuses both)
    config["deepspeed_config"] = {"deepspeed_config_file": str(ds_file), "zero3_init_flag": stage == 3}
    path = tmp_path / f"deepspeed_zero{stage}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_replay_resume_from_the_shipped_zero3_yaml(tmp_path):
    """GRPOWithReplayBufferTrainer launched from examples/accelerate/deepspeed_zero3.yaml (`zero3_init_flag` on,
    partitioning forced), stopped after checkpoint-2 and resumed with resume_from_checkpoint=True to step 4: both
    ranks' buffers restored, metrics of steps 1-4 (rel 1e-5) and the final buffer equal an uninterrupted run's,
    DeepSpeed's `global_step2/` in the checkpoint."""
    pytest.importorskip("deepspeed", reason="DeepSpeed runs need `pip install replayrl[deepspeed]`")
    from tests.grpo.test_fsdp import check_resume, launch

    out = tmp_path / "resume"
    env = strategy_flags("zero3", tmp_path)[1]  # DS_ACCELERATOR=cpu, no ACCELERATE_USE_CPU
    ranks = launch(zero_cpu_variant(3, tmp_path), "resume", out, 29663, env=env)
    assert all(r["distributed_type"] == "DistributedType.DEEPSPEED" and r["zero_stage"] == 3 for r in ranks)
    for r in ranks:
        assert_sharded("zero3", r["sharding"])
    check_resume(ranks, out)
    assert list((out / "checkpoint-2").glob("global_step*"))  # DeepSpeed's checkpoint of the engine
