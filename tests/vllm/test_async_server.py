"""Asynchronous GRPO against `replayrl vllm-serve`: a producer thread sends the next generation batch to the server
while the trainer optimizes; the server reloads the pushed weights between batches; the behaviour log-probs are the
server's; nothing is left running. One test: the server takes ~1-2 minutes to start on a busy 2-core machine."""

import signal
import subprocess
import sys
import threading

import pytest
import torch

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.generation.vllm_colocate import free_port
from replayrl.generation.vllm_server import wait_for_server
from replayrl.models.tiny import prompt_dataset
from tests.vllm.test_grpo import _vllm_args, digit_reward


@pytest.mark.slow
def test_async_grpo_trains_against_replayrl_vllm_serve(tmp_path, vllm_model_dir):
    port = free_port()
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115
    command = [sys.executable, "-m", "replayrl", "vllm-serve", "--model", vllm_model_dir, "--port", str(port)]
    command += ["--max_model_len", "64", "--dtype", "float32"]
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_server(f"http://127.0.0.1:{port}", 600, server)
        args = _vllm_args(
            GRPOConfig, tmp_path, vllm_mode="server", vllm_server_port=port, max_steps=4, async_generation=True
        )
        trainer = GRPOTrainer(vllm_model_dir, digit_reward, args=args, train_dataset=prompt_dataset(24))
        trained = []
        original = trainer.compute_loss

        def compute_loss(model, inputs, *a, **k):
            loss = original(model, inputs, *a, **k)
            real = inputs.completion_mask.bool()
            same = torch.equal(inputs.old_logps[real], inputs.engine_logps[real])
            trained.append((trainer.state.global_step, set(inputs.policy_version.tolist()), same))
            return loss

        trainer.compute_loss = compute_loss
        threads = {t.ident for t in threading.enumerate()}
        trainer.train()
        # each batch sampled by the weights one step older than the trainer's (the server reloaded them), and the
        # behaviour log-probs used are the server's
        assert trained == [(0, {0}, True), (1, {0}, True), (2, {1}, True), (3, {2}, True)]
        logs = [h for h in trainer.state.log_history if "loss" in h]
        assert [h["async/staleness/max"] for h in logs] == [0.0, 1.0, 1.0, 1.0]
        assert {t.ident for t in threading.enumerate()} <= threads  # the producer thread ended with train()
    finally:
        server.send_signal(signal.SIGTERM)
        status = server.wait(timeout=120)
        log.close()
    assert status == 0, (tmp_path / "server.log").read_text()[-2000:]
