"""Two CPU processes under `accelerate launch` (gloo): training works, the loss and the update equal the
single-process ones on the same global batch, and the replay buffer is one logical buffer."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.grpo.rollout import Rollout
from replayrl.models.tiny import build_tiny_model, prompt_dataset
from tests.conftest import cpu_launch_env, tiny_args

WORKER = Path(__file__).with_name("distributed_worker.py")


def launch(mode: str, out: Path) -> list | dict:
    out.mkdir(parents=True, exist_ok=True)
    env = cpu_launch_env()
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--multi_gpu",
        "--main_process_port",
        "29511",
        str(WORKER),
        mode,
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(out / "result.pt", weights_only=False)


def test_two_processes_match_one_process_on_the_same_global_batch(tokenizer, tmp_path):
    check_grpo_step(launch("grpo", tmp_path / "ddp"), tokenizer, tmp_path)


def check_grpo_step(result: dict, tokenizer, tmp_path: Path) -> None:
    """The 2-process step (`distributed_worker.grpo_step`) equals one process's on the same global batch: loss
    (rel 1e-4) and parameters (rtol 1e-4, atol 1e-6), recomputed here from the batch each process trained on."""
    assert result["world"] == 2
    rows = [Rollout.from_state_dict(mb) for rank in result["batches"] for mb in rank]
    batch = Rollout.concat(rows).with_(old_logps=None, loss_weights=None)
    assert batch.num_rows == 8  # 2 processes x 4 rows, whole groups of 4 each

    # The same step in one process: same initial weights, the global batch, one SGD step with lr 1.
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = tiny_args(GRPOConfig, tmp_path, per_device_train_batch_size=8, beta=0.1)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=prompt_dataset(8),
        processing_class=tokenizer,
    )
    init = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, trainer._finalize_rollout(batch))
    loss.backward()
    assert loss.item() == pytest.approx(result["loss"], rel=1e-4, abs=1e-6)
    assert len(result["params"]) == len(init)
    for p0, p, after in zip(init, trainer.model.parameters(), result["params"]):
        torch.testing.assert_close(p0 - p.grad, after, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["replay", "replay_rollout"])
def test_replay_buffer_is_shared_across_processes(tmp_path, mode):
    ranks = launch(mode, tmp_path / mode)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["buffer"] == ranks[1]["buffer"] and ranks[0]["buffer"]  # one logical buffer
    # rank 1 never produces a group with signal: its replayed rows can only come from rank 0's groups
    assert ranks[1]["replayed_rows"] > 0
    logs = [h for h in ranks[0]["logs"] if "replay/groups_replaced" in h]
    assert sum(h["replay/groups_replaced"] for h in logs) > 0
