"""GRPO step time with vLLM colocate vs transformers `generate`, same model, data and settings.

    .venv-vllm/bin/python benchmarks/vllm_step.py                  # `larger` config, 3 rounds
    .venv-vllm/bin/python benchmarks/vllm_step.py --rounds 1 --steps 3

Each (round, backend) runs in a fresh process (the backends alternate within a round, A/B), trains `--warmup`
untimed optimizer steps and `--steps` timed ones, and reports the median seconds per step and its generation
share (`timing/generation`, which includes the weight sync). Prints a table; the ratio is vLLM / transformers.
Needs vLLM (run it with the .venv-vllm interpreter, see scripts/setup_vllm.sh).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2)  # `larger` in common.py (head_dim 64)
RUN = dict(per_device_train_batch_size=16, num_generations=8, max_completion_length=64)


def worker(backend: str, model_dir: str, warmup: int, steps: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)  # before the engine starts (vLLM's CPU worker pins the thread pool)
    from transformers import TrainerCallback

    from replayrl import GRPOConfig, GRPOTrainer
    from replayrl.models.tiny import prompt_dataset

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.start)

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, use_vllm=backend == "vllm", max_steps=warmup + steps, learning_rate=1e-5, beta=0.0,
            temperature=1.0, top_k=None, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
            disable_tqdm=True, seed=0, max_prompt_length=64, **RUN,
        )  # fmt: skip
        reward = lambda completions, **kw: [float(len(c) % 7) for c in completions]  # noqa: E731
        trainer = GRPOTrainer(model_dir, reward, args=args, train_dataset=prompt_dataset(256), callbacks=[Clock()])
        trainer.train()
    generation = [log["timing/generation"] for log in trainer.state.log_history if "timing/generation" in log]
    tokens = [log["num_tokens"] for log in trainer.state.log_history if "num_tokens" in log]
    timed = times[warmup:]
    return {
        "step_s": statistics.median(timed),
        "generation_s": statistics.median(generation[warmup:]),
        "tokens_per_s": (tokens[-1] - tokens[warmup - 1]) / sum(timed) if warmup else tokens[-1] / sum(timed),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--worker", choices=["hf", "vllm"], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.model_dir, args.warmup, args.steps, args.threads)))
        return
    from replayrl.models.tiny import save_tiny

    results: dict[str, list[dict]] = {"hf": [], "vllm": []}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny(Path(tmp) / "model", **MODEL)
        for _ in range(args.rounds):
            for backend in ("hf", "vllm"):
                command = [sys.executable, __file__, "--worker", backend, "--model-dir", model_dir]
                command += ["--warmup", str(args.warmup), "--steps", str(args.steps), "--threads", str(args.threads)]
                done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=True)
                results[backend].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{'backend':<8} {'step s':>8} {'generation s':>13} {'gen share':>10} {'tokens/s':>9}")
    medians = {}
    for backend, runs in results.items():
        m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        medians[backend] = m
        share = m["generation_s"] / m["step_s"]
        print(f"{backend:<8} {m['step_s']:>8.3f} {m['generation_s']:>13.3f} {share:>10.0%} {m['tokens_per_s']:>9.0f}")
    print(f"step time ratio vllm / hf: {medians['vllm']['step_s'] / medians['hf']['step_s']:.2f}")


if __name__ == "__main__":
    main()
