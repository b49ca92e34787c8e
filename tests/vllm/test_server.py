"""Server mode end to end: `replayrl vllm-serve` on a free loopback port, GRPO trains against it (the weight sync
goes through the server's /collective_rpc), then the server shuts down cleanly on SIGTERM. One test: the server
takes ~1-2 minutes to start on a busy 2-core machine."""

import signal
import subprocess
import sys

import pytest

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.generation.vllm_colocate import free_port
from replayrl.generation.vllm_server import ServerError, server_info, wait_for_server
from replayrl.models.tiny import prompt_dataset
from tests.vllm.test_grpo import _history, _vllm_args, digit_reward


@pytest.mark.slow
def test_grpo_trains_against_replayrl_vllm_serve(tmp_path, vllm_model_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115
    command = [sys.executable, "-m", "replayrl", "vllm-serve", "--model", vllm_model_dir, "--port", str(port)]
    command += ["--max_model_len", "64", "--dtype", "float32"]  # "auto" would run a float32 checkpoint in bf16
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_server(url, 600, server)
        args = _vllm_args(GRPOConfig, tmp_path, vllm_mode="server", vllm_server_port=port, max_steps=3)
        trainer = GRPOTrainer(vllm_model_dir, digit_reward, args=args, train_dataset=prompt_dataset(24))
        assert server_info(url) == {"dtype": "float32"}  # what it runs, asked of its workers
        with pytest.warns(UserWarning, match="runs the model in float32 but the trainer computes in bfloat16"):
            GRPOTrainer(vllm_model_dir, digit_reward, args=_vllm_args(GRPOConfig, tmp_path / "bf16", vllm_mode="server",
                        vllm_server_port=port, bf16=True), train_dataset=prompt_dataset(24))  # fmt: skip
        trainer.train()
        assert len(_history(trainer, "reward")) == 3
        # steps 2 and 3 generated after optimizer steps at lr 3e-2: only a working sync keeps this at ~0
        assert max(_history(trainer, "sampling/sampling_logp_difference/max")) < 1e-4
        assert len(_history(trainer, "timing/weight_sync")) == 3
    finally:
        server.send_signal(signal.SIGTERM)
        status = server.wait(timeout=120)
        log.close()
    assert status == 0, (tmp_path / "server.log").read_text()[-2000:]
    assert "runs in float32; --dtype float32" in (tmp_path / "server.log").read_text()
    with pytest.raises(ServerError):
        wait_for_server(url, timeout=1)
