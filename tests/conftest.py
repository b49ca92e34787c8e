"""Shared fixtures: a tiny local Qwen2 model + tokenizer and small prompt sets. Nothing touches a hub."""

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from replayrl.models.tiny import build_tiny_model, build_tokenizer, prompt_dataset, save_tiny  # noqa: E402

torch.set_num_threads(1)  # the machine is shared; tiny models gain little from more


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def bos_tokenizer():
    """The tiny tokenizer, Llama-style: `<s>` (id 101) first in `tokenizer(text)` and in the chat template."""
    return build_tokenizer(bos=True)


@pytest.fixture
def model(tokenizer):
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-qwen2"), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


@pytest.fixture
def dataset():
    return prompt_dataset(16)


@pytest.fixture
def chat_dataset():
    return prompt_dataset(16, conversational=True)


# Training arguments every end-to-end test wants: CPU, seeded, a log per step, no saves, no trackers, no bars.
QUIET_CPU_RUN = dict(logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True)


def tiny_moe_model(tokenizer, **overrides):
    """A seeded one-layer Qwen2-MoE (4 experts, 2 per token) that asks for its router logits, for the MoE paths."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    settings = dict(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=4,
        num_experts_per_tok=2, output_router_logits=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2MoeForCausalLM(Qwen2MoeConfig(**{**settings, **overrides}))


def tiny_args(cls, tmp_path, **overrides):
    """Small, fast, deterministic settings for end-to-end runs."""
    kwargs = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_prompt_length=32,
        max_steps=2,
        learning_rate=1e-2,
        **QUIET_CPU_RUN,
    )
    kwargs.update(overrides)
    return cls(**kwargs)


def assert_same_updates(results: list[tuple[float, list[torch.Tensor]]], untrained: list[torch.Tensor]) -> None:
    """Every (logged loss, parameters after the step) equals the first, and the first differs from `untrained`."""
    (ref_loss, ref_params), *others = results
    for loss, params in others:
        assert loss == pytest.approx(ref_loss, abs=1e-6)
        for a, b in zip(params, ref_params):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(ref_params, untrained))


def cpu_launch_env() -> dict[str, str]:
    """Environment for `accelerate launch` of CPU processes (gloo) on any machine: a visible GPU would otherwise
    make accelerate pick it (and NCCL, one device for two processes). `ACCELERATE_USE_CPU` + `--multi_gpu` is
    accelerate's way to start several CPU processes (`--cpu` alone starts one)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    env.update(CUDA_VISIBLE_DEVICES="", ACCELERATE_USE_CPU="true")
    return env


def launch_two_processes(worker: Path, out: Path, port: int, *args: str) -> dict:
    """`accelerate launch --num_processes 2 worker out *args` on CPU (gloo); the worker saves `out/result.pt`
    from its main process, which is returned."""
    out.mkdir(parents=True, exist_ok=True)
    env = cpu_launch_env()
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", "--multi_gpu", "--main_process_port", str(port)]
    proc = subprocess.run([*cmd, str(worker), str(out), *args], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(out / "result.pt", weights_only=False)


def loss_logs(trainer, stop: bool = False, resume=None) -> list[dict]:
    """Train (with `stop`: only the first optimizer step; `resume`: from that checkpoint) and return the loss logs:
    the body of a `run` for `full_and_resumed_logs`."""
    from transformers import TrainerCallback

    class StopAfterFirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step >= 1

    if stop:
        trainer.add_callback(StopAfterFirstStep())
    trainer.train(resume_from_checkpoint=resume)
    return [h for h in trainer.state.log_history if "loss" in h]


def full_and_resumed_logs(run, tmp_path: Path, steps: int = 4) -> list[tuple[dict, dict]]:
    """Exact-resume check: `run(out, stop=..., resume=...)` trains `steps` optimizer steps saving every step and
    returns its loss logs; with stop=True it must stop after step 1. Returns (full run, resumed run) log pairs of
    steps 2..steps, after asserting the resumed run covers exactly those."""
    full = run(tmp_path / "full")
    run(tmp_path / "part", stop=True)
    resumed = [h for h in run(tmp_path / "part", resume=str(tmp_path / "part" / "checkpoint-1")) if h["step"] > 1]
    assert [h["step"] for h in resumed] == list(range(2, steps + 1))
    return list(zip(full[1:], resumed))


@pytest.fixture
def fast_warm_up(monkeypatch):
    """The built-in addition policy with a 10-step warm-up instead of 300 (the slowest part of a short CLI run)."""
    from replayrl.tasks import addition

    real = addition.warm_up
    monkeypatch.setattr(addition, "warm_up", lambda model, tok, seed: real(model, tok, seed, steps=10))


def assert_accumulation_invariant(make, tmp_path: Path, steps: int = 1, **overrides) -> list[list[dict]]:
    """`make(out_dir, **kwargs)` -> a trainer; trained `steps` SGD steps (lr 1, no clipping) as 1 micro-batch of 8
    rows and as 8 micro-batches of 1: the same logged losses and parameters. Returns both runs' log histories."""
    runs = []
    for bs, ga in [(8, 1), (1, 8)]:
        trainer = make(tmp_path / f"ga{ga}", per_device_train_batch_size=bs, gradient_accumulation_steps=ga,
                       max_steps=steps, optim="sgd", learning_rate=1.0, max_grad_norm=0.0, **overrides)  # fmt: skip
        trainer.train()
        runs.append(([p.detach().clone() for p in trainer.model.parameters()], trainer.state.log_history))
    (p8, log8), (p1, log1) = runs
    for step in range(steps):
        assert log1[step]["loss"] == pytest.approx(log8[step]["loss"], rel=1e-4, abs=1e-6), step
    for a, b in zip(p1, p8):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    return [log8, log1]
