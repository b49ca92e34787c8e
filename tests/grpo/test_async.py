"""Asynchronous generation (`async_generation=True`) through `train()`: a worker process samples ahead, every row
carries the version of the weights that sampled it, stale batches are dropped and counted, the behaviour log-probs
are the engine's, failures and Ctrl-C leave nothing running, resume is exact."""

import multiprocessing
import threading
import time

import pytest
import torch
from transformers import TrainerCallback

from replayrl import GRPOConfig, GRPOTrainer, GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from replayrl.generation.async_worker import GenerationWorkerError
from replayrl.models.tiny import build_tiny_model, prompt_dataset
from replayrl.rloo import RLOOConfig, RLOOTrainer
from tests.conftest import full_and_resumed_logs, loss_logs, tiny_args


def varied_reward(completions, **kwargs):
    return [float(sum(map(ord, c)) % 7) for c in completions]


def small_model(tokenizer):
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


class Recorder:
    """What compute_loss trained on: (optimizer step, versions, rows' behaviour and engine log-probs, current
    log-probs) per micro-batch."""

    def __init__(self):
        self.batches = []

    def wrap(self, trainer):
        original = trainer.compute_loss

        def compute_loss(model, inputs, *args, **kwargs):
            loss = original(model, inputs, *args, **kwargs)
            if model.training:
                with torch.no_grad():
                    current = trainer._token_logps(model, inputs)[0]
                self.batches.append(
                    dict(
                        step=trainer.state.global_step,
                        versions=inputs.policy_version.tolist(),
                        mask=inputs.completion_mask.bool(),
                        old=inputs.old_logps.clone(),
                        engine=inputs.engine_logps.clone(),
                        current=current,
                        completions=inputs.completion_ids.clone(),
                    )
                )
            return loss

        trainer.compute_loss = compute_loss
        return self


def make(cls, config, model, tokenizer, dataset, tmp_path, **overrides):
    args = tiny_args(config, tmp_path, async_generation=True, beta=0.0, **overrides)
    return cls(model=model, reward_funcs=varied_reward, args=args, train_dataset=dataset, processing_class=tokenizer)


def nothing_left(threads_before: set) -> None:
    assert multiprocessing.active_children() == []
    assert {t.ident for t in threading.enumerate()} <= threads_before


def test_async_rows_carry_their_version_and_the_engines_log_probs(tokenizer, dataset, tmp_path):
    """Through TRL's import path (`trl.experimental.async_grpo`), whose config has TRL's defaults."""
    from replayrl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    defaults = AsyncGRPOConfig(output_dir=str(tmp_path / "d"), use_cpu=True, report_to="none")
    assert defaults.async_generation and (defaults.max_staleness, defaults.weight_sync_steps) == (4, 1)
    assert (defaults.max_inflight_tasks, defaults.queue_maxsize, defaults.max_completion_length) == (-1, 1024, 2048)
    trainer = make(AsyncGRPOTrainer, AsyncGRPOConfig, small_model(tokenizer), tokenizer, dataset, tmp_path, max_steps=4)
    record = Recorder().wrap(trainer)
    threads = {t.ident for t in threading.enumerate()}
    trainer.train()
    # the first batch is sampled by the initial weights; each later one while the trainer took the previous step
    assert [(b["step"], set(b["versions"])) for b in record.batches] == [(0, {0}), (1, {0}), (2, {1}), (3, {2})]
    for b in record.batches:  # the behaviour log-probs are the engine's, on every real token
        assert torch.equal(b["old"][b["mask"]], b["engine"][b["mask"]])
    first = record.batches[0]  # same weights: the worker's log-probs of its tokens are the trainer's
    torch.testing.assert_close(first["engine"][first["mask"]], first["current"][first["mask"]], atol=1e-4, rtol=0)
    later = record.batches[2]  # a step behind: not the current policy's
    assert not torch.allclose(later["engine"][later["mask"]], later["current"][later["mask"]], atol=1e-4)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["async/staleness/max"] for h in logs] == [0.0, 1.0, 1.0, 1.0]
    assert all(h["async/dropped_rows"] == 0 for h in logs)
    assert all(0.0 <= h["async/overlap"] <= 1.0 and h["async/trainer_wait"] >= 0 for h in logs)
    assert trainer._async.mismatches == 0  # the worker was fed the dataloader's own prompts
    nothing_left(threads)


def test_stale_batches_are_dropped_counted_and_never_trained(tokenizer, tmp_path):
    """A producer two batches ahead whose weights are synced every 3 steps, a bound of 1: batches sampled by weights
    2+ steps old are dropped and sampled again with the current weights. Three prompts: two epochs."""
    trainer = make(
        GRPOTrainer,
        GRPOConfig,
        small_model(tokenizer),
        tokenizer,
        prompt_dataset(3),
        tmp_path,
        max_steps=6,
        max_staleness=1,
        weight_sync_steps=3,
        max_inflight_tasks=8,  # two generation batches of 4 rows
    )
    record = Recorder().wrap(trainer)
    trainer.train()
    assert len(record.batches) == 6
    for b in record.batches:
        assert all(b["step"] - v <= 1 for v in b["versions"]), (b["step"], b["versions"])
    dropped = trainer.state.log_history[-2]["async/dropped_rows"]
    assert dropped > 0 and dropped % 4 == 0
    assert trainer._async.dropped_rows == dropped
    assert trainer._async.mismatches == 0  # the read-ahead followed the dataloader across epochs


def test_a_worker_error_reaches_train_with_its_message_and_nothing_is_left(tokenizer, dataset, tmp_path):
    trainer = make(GRPOTrainer, GRPOConfig, small_model(tokenizer), tokenizer, dataset, tmp_path, max_steps=2)
    trainer.generation_config.temperature = -1.0  # only the producer's generate() checks it
    threads = {t.ident for t in threading.enumerate()}
    start = time.perf_counter()
    with pytest.raises(GenerationWorkerError, match="temperature"):
        trainer.train()  # the first batches are claimed while the worker starts: the error is raised here
    assert time.perf_counter() - start < 60
    nothing_left(threads)


def test_an_error_in_the_worker_process_reaches_the_trainer_with_its_traceback(tokenizer):
    """The same failure inside the worker process (it was up before the request): `result()` raises it."""
    from transformers import GenerationConfig

    from replayrl.generation.async_worker import GenerationWorker

    config = GenerationConfig(max_new_tokens=3, do_sample=True, temperature=-1.0, pad_token_id=tokenizer.pad_token_id)
    worker = GenerationWorker(small_model(tokenizer), config, version=0)
    try:
        batch = tokenizer(["ab", "cd"], return_tensors="pt")
        worker.submit(0, batch.input_ids, batch.attention_mask, seed=0)
        with pytest.raises(GenerationWorkerError, match=r"temperature(.|\n)*Traceback"):
            worker.result()  # never claimed: the worker itself generates and fails
    finally:
        worker.close()
    assert not worker._process.is_alive()


def test_a_killed_worker_is_reported_with_its_exit_code(tokenizer, dataset, tmp_path):
    import os
    import signal

    class Kill(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                os.kill(trainer._async.worker.pid, signal.SIGKILL)

    trainer = make(GRPOTrainer, GRPOConfig, small_model(tokenizer), tokenizer, dataset, tmp_path, max_steps=4)
    trainer.add_callback(Kill())
    threads = {t.ident for t in threading.enumerate()}
    with pytest.raises(GenerationWorkerError, match="exited with code -9"):
        trainer.train()
    nothing_left(threads)


def test_ctrl_c_stops_the_worker(tokenizer, dataset, tmp_path):
    class Interrupt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise KeyboardInterrupt

    trainer = make(GRPOTrainer, GRPOConfig, small_model(tokenizer), tokenizer, dataset, tmp_path, max_steps=5)
    trainer.add_callback(Interrupt())
    threads = {t.ident for t in threading.enumerate()}
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    nothing_left(threads)


def test_resume_is_exact_with_the_in_flight_batch_saved(tokenizer, dataset, tmp_path):
    def run(out, stop=False, resume=None):
        torch.manual_seed(0)
        trainer = make(
            GRPOTrainer,
            GRPOConfig,
            small_model(tokenizer),
            tokenizer,
            dataset,
            out,
            output_dir=str(out),
            max_steps=4,
            save_strategy="steps",
            save_steps=1,
        )
        return loss_logs(trainer, stop, resume)

    for full, resumed in full_and_resumed_logs(run, tmp_path):
        assert resumed["loss"] == pytest.approx(full["loss"], abs=1e-6)
        assert resumed["reward"] == full["reward"]
        assert resumed["async/staleness/max"] == full["async/staleness/max"]


@pytest.mark.parametrize(
    "cls,config", [(GRPOWithReplayBufferTrainer, GRPOWithReplayBufferConfig), (RLOOTrainer, RLOOConfig)]
)
def test_replay_and_rloo_trainers_train_asynchronously(cls, config, tokenizer, dataset, tmp_path):
    trainer = make(cls, config, small_model(tokenizer), tokenizer, dataset, tmp_path, max_steps=3, replay_buffer_size=4)
    record = Recorder().wrap(trainer)
    trainer.train()
    assert [set(b["versions"]) for b in record.batches] == [{0}, {0}, {1}]
    groups = trainer.replay_buffer.groups
    assert groups  # groups with variance entered the buffer, aged by the version of the weights that sampled them
    assert all(g.version == int(g.rollout.policy_version[0]) for g in groups)
    assert {g.version for g in groups} <= {0, 1} and any(g.version == 0 for g in groups[1:])


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(max_staleness=-1), "max_staleness"),
        (dict(weight_sync_steps=0), "weight_sync_steps"),
        (dict(max_inflight_tasks=0), "max_inflight_tasks"),
        (dict(queue_maxsize=2), "queue_maxsize"),
        (dict(use_vllm=True, vllm_mode="colocate"), "colocate"),
        (dict(dynamic_sampling=True), "dynamic_sampling"),
    ],
)
def test_bad_async_settings_are_refused_in_one_line(overrides, match, tmp_path):
    with pytest.raises(ValueError, match=match) as err:
        tiny_args(GRPOConfig, tmp_path, async_generation=True, **overrides)
    assert "\n" not in str(err.value)


def test_tools_are_refused_at_construction(tokenizer, dataset, tmp_path):
    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: first
            b: second
        """
        return a + b

    args = tiny_args(GRPOConfig, tmp_path, async_generation=True)
    with pytest.raises(ValueError, match="tools"):
        GRPOTrainer(
            model=small_model(tokenizer),
            reward_funcs=varied_reward,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            tools=[add],
        )


def test_two_processes_each_with_a_worker(tmp_path):
    from pathlib import Path

    from tests.conftest import launch_two_processes

    result = launch_two_processes(Path(__file__).with_name("async_ddp_worker.py"), tmp_path / "ddp", 29537)
    ranks = result["ranks"]
    assert len(ranks) == 2 and all(r["children"] == 0 for r in ranks)
    for rank in ranks:
        assert [(step, set(versions)) for step, versions, _ in rank["trained"]] == [(0, {0}), (1, {0}), (2, {1})]
    assert ranks[0]["trained"][0][2] != ranks[1]["trained"][0][2]  # each rank trains its own share of prompts
    assert result["mismatches"] == 0


def test_lora_weights_reach_the_worker_merged(tokenizer, dataset, tmp_path):
    """max_staleness=0: each read-ahead batch (one step old) is dropped and sampled again with the current weights,
    so the worker's log-probs must equal the trainer's at every step: the LoRA update reaches it, merged. Also:
    remove_unused_columns=True, whose dataloader rows the read-ahead must match."""
    from peft import LoraConfig

    args = tiny_args(
        GRPOConfig, tmp_path, async_generation=True, beta=0.0, max_steps=3, max_staleness=0, remove_unused_columns=True
    )
    trainer = GRPOTrainer(
        model=small_model(tokenizer),
        reward_funcs=varied_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_alpha=64),
    )
    record = Recorder().wrap(trainer)
    trainer.train()
    assert [(b["step"], set(b["versions"])) for b in record.batches] == [(0, {0}), (1, {1}), (2, {2})]
    for b in record.batches:
        torch.testing.assert_close(b["engine"][b["mask"]], b["current"][b["mask"]], atol=1e-4, rtol=0)
    assert trainer._async.dropped_rows == 8 and trainer._async.mismatches == 0


def test_a_batch_claimed_while_the_worker_starts_is_the_one_the_worker_would_have_sampled(tokenizer):
    """While the worker process starts, the trainer takes back its unstarted requests and samples them itself, with
    the shared weights and the request's seed: the same completions and log-probs as the worker's, the trainer's
    random state untouched, and the worker skips the claimed request."""
    from transformers import GenerationConfig

    from replayrl.generation.async_worker import GenerationWorker

    model = small_model(tokenizer)
    config = GenerationConfig(
        max_new_tokens=6,
        do_sample=True,
        top_k=0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    batch = tokenizer(["ab", "hello", "xyz"], return_tensors="pt", padding=True, padding_side="left")
    claimer, worker = GenerationWorker(model, config, version=3), GenerationWorker(model, config, version=3)
    try:
        claimer.submit(0, batch.input_ids, batch.attention_mask, seed=11)
        rng = torch.get_rng_state()
        (claimed,) = claimer.claim_unstarted()  # at once: the process is still importing torch
        assert torch.equal(torch.get_rng_state(), rng)
        worker.submit(0, batch.input_ids, batch.attention_mask, seed=11)
        sampled = worker.result()
        assert claimed.here and not sampled.here and claimed.version == sampled.version == 3
        assert torch.equal(claimed.completion_ids, sampled.completion_ids)
        assert torch.equal(claimed.completion_mask, sampled.completion_mask)
        assert torch.allclose(claimed.logps, sampled.logps, equal_nan=True, atol=0, rtol=0)
        claimer.submit(1, batch.input_ids, batch.attention_mask, seed=12)
        assert claimer.result().batch == 1  # request 0 was skipped by the worker
        claimer.submit(2, batch.input_ids, batch.attention_mask, seed=13)
        assert claimer.claim_unstarted() == [] and claimer._local is None  # the worker is up: no claim, no copy
        assert claimer.result().batch == 2
    finally:
        claimer.close(), worker.close()


def test_fresh_rows_of_the_replay_trainer_keep_the_clipped_ratio_against_the_worker_that_sampled_them(
    tokenizer, dataset, tmp_path
):
    """Asynchronous fresh rows are one step stale: their behaviour log-probs are the worker's, and the loss takes the
    PPO ratio against them (importance weight 1, proximal = behaviour); only replayed rows get the decoupled
    objective's truncated weights."""

    class Spy(GRPOWithReplayBufferTrainer):
        seen: list = []

        def _behaviour_correction(self, batch, current, old):
            proximal, weights = super()._behaviour_correction(batch, current, old)
            self.seen.append((self.state.global_step, batch, old.clone(), proximal, weights))
            return proximal, weights

    trainer = make(
        Spy, GRPOWithReplayBufferConfig, small_model(tokenizer), tokenizer, dataset, tmp_path,
        max_steps=4, replay_buffer_size=4, replay_importance_cap=2.0,
    )  # fmt: skip
    trainer.train()
    stale_fresh = 0
    for step, batch, old, proximal, weights in trainer.seen:
        fresh = ~batch.replayed
        stale_fresh += int((fresh & (batch.policy_version < step)).sum())
        assert torch.equal(proximal[fresh], old[fresh]) and torch.equal(weights[fresh], torch.ones_like(old[fresh]))
    assert stale_fresh > 0


_PARENT = """
import sys, time
from transformers import GenerationConfig
from replayrl.generation.async_worker import GenerationWorker
from replayrl.models.tiny import build_tiny_model, build_tokenizer

tok = build_tokenizer()
model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
worker = GenerationWorker(model, GenerationConfig(max_new_tokens=2, do_sample=True), version=0)
print(worker.pid, flush=True)
while not worker._ready.value:
    time.sleep(0.05)
if "half-sent" in sys.argv:  # killed in the middle of sending a request: a length header, no payload
    import os, struct
    os.write(worker._requests._writer.fileno(), struct.pack("!i", 1000))
print("ready", flush=True)
time.sleep(600)
"""


def test_the_worker_dies_with_a_trainer_killed_without_cleanup(tmp_path):
    """SIGKILL of the trainer's process (no `finally`, no atexit) while a request is half-written: the worker, blocked
    reading it, must not outlive the trainer (polling for the parent between requests would never run again)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    parent = subprocess.Popen([sys.executable, str(script), "half-sent"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pid = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "ready"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.time() + 10
        while time.time() < deadline and _running(pid):
            time.sleep(0.1)
        assert not _running(pid)
    finally:
        parent.kill()


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit may not be reaped in a container)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
