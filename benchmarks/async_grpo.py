"""Synchronous vs asynchronous GRPO (`async_generation`, docs/async.md): step time against the overlap limit, and
reward against wall-clock, on the same backend (transformers generate), data and seeds.

    python benchmarks/async_grpo.py --mode timing                 # every setting, sync and async, seed 0
    python benchmarks/async_grpo.py --mode learning --seeds 0 1 2 --steps 60   # the built-in job, per seed
    python benchmarks/async_grpo.py --quick                       # smoke run
    .venv-vllm/bin/python benchmarks/async_grpo.py --backend vllm # the same against a `replayrl vllm-serve` server
    .venv-vllm/bin/python benchmarks/async_grpo.py --mode learning --task sparse_long --backend vllm --server-core 1 \
        --set per_device_train_batch_size=256 top_k=null          # learning against the server (long tasks)

Timing: each arm trains `steps` optimizer steps after `warmup` untimed ones; a step's time is the wall-clock between
consecutive `on_step_end` callbacks. On the synchronous run, `generation` is the median `timing/generation` (the
`generate()` call) and `rest` the median step time minus it; the overlap limit is max(generation, rest), the best an
asynchronous step can do. Both arms get the same cores: the synchronous run uses `--threads` torch threads, the
asynchronous one splits them between the trainer and its worker process (`--threads 1`: one thread for the
synchronous run, one per side for the asynchronous one; on a machine shared with other jobs a second torch thread
can make a step slower, not faster, so both are reported).

Learning (`--mode learning`): `replayrl grpo`'s built-in job (the warmed-up tiny addition policy, exact-match
reward, replay buffer; docs/grpo.md) synchronous and asynchronous from the same seed, one torch thread per process.
`--task long|sparse_long`: jobs with longer completions (`long_job`); `--set KEY=VALUE`
overrides their config. Each row also gives the synchronous step, the share of it `generate()` takes, and the
asynchronous step against the overlap limit and the synchronous step (medians after step 10).
"to R" = seconds until the moving average (5 steps) of the training reward reaches R = 0.9 x the synchronous run's
final moving average; "at budget" = each arm's moving average after a fixed wall-clock.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_results  # noqa: E402

SETTINGS = {
    # name: (completion length, model size, per_device_train_batch_size, num_generations)
    "short": dict(max_completion_length=8, hidden_size=64, num_layers=2, batch=16, num_generations=4),
    "long": dict(max_completion_length=48, hidden_size=64, num_layers=2, batch=16, num_generations=4),
    "larger": dict(max_completion_length=32, hidden_size=256, num_layers=4, batch=16, num_generations=8),
}
WINDOW = 5


def char_reward(completions, **kwargs) -> list[float]:
    """Dense, deterministic: the fraction of digits in the completion (the timing runs need some variance only)."""
    return [sum(c.isdigit() for c in s) / max(1, len(s)) for s in completions]


class StepClock:
    def __init__(self):
        from transformers import TrainerCallback

        clock = self

        class _Callback(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                clock.stamps.append(time.perf_counter())

        self.stamps: list[float] = []
        self.callback = _Callback()


def run_arm(setting: str, arm: str, seed: int, steps: int, threads: int, reward, out: Path, server=None) -> dict:
    """One run; `server`: (model folder, port) of a `replayrl vllm-serve` server to generate with (`--backend vllm`)."""
    import torch
    from datasets import Dataset

    from replayrl import GRPOConfig, GRPOTrainer
    from replayrl.models.tiny import build_tiny_model, build_tokenizer
    from replayrl.tasks.addition import problems

    s = SETTINGS[setting]
    torch.set_num_threads(threads)
    if server is not None:
        pin_trainer()
    tok = build_tokenizer()
    torch.manual_seed(seed)
    model = build_tiny_model(tok, hidden_size=s["hidden_size"], num_layers=s["num_layers"], num_heads=4, num_kv_heads=2)
    vllm = {}
    if server is not None:  # the server's model (vLLM's CPU attention needs head_dim 32)
        model, vllm = server[0], vllm_fields(server)
    dataset = Dataset.from_list([{"prompt": f"{a}+{b}="} for a, b in problems()])
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=s["batch"],
        num_generations=s["num_generations"],
        max_completion_length=s["max_completion_length"],
        max_prompt_length=16,
        max_steps=steps,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        beta=0.0,
        temperature=1.0,
        top_k=None,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=seed,
        disable_tqdm=True,
        async_generation=arm == "async",
        **vllm,
    )
    clock = StepClock()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tok)
    trainer.add_callback(clock.callback)
    start = time.perf_counter()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return dict(
        setting=setting,
        arm=arm,
        seed=seed,
        threads=threads,
        start=start,
        stamps=[t - start for t in clock.stamps],
        rewards=[h["reward"] for h in logs],
        generation=[h.get("timing/generation", 0.0) for h in logs],
        staleness=[h.get("async/staleness/mean", 0.0) for h in logs],
        overlap=[h.get("async/overlap") for h in logs],
        trainer_wait=[h.get("async/trainer_wait") for h in logs],
        dropped=max([h.get("async/dropped_rows", 0.0) for h in logs] or [0.0]),
    )


def step_times(run: dict, warmup: int) -> list[float]:
    stamps = run["stamps"]
    return [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1 :])]


SERVER_CORE: int | None = None  # `--server-core N`: the vLLM server's core; the trainer is pinned to the others


def start_server(name: str, work: Path, **model_kwargs):
    """A `replayrl vllm-serve` server (this interpreter: run from .venv-vllm) on a tiny model (`save_tiny`'s kwargs;
    vLLM's CPU attention needs head_dim 32). The trainers push their own weights before their first batch."""
    import os
    import subprocess

    from replayrl.generation.vllm_colocate import free_port
    from replayrl.generation.vllm_server import wait_for_server
    from replayrl.models.tiny import save_tiny

    folder = save_tiny(work / f"model-{name}", **model_kwargs)
    port = free_port()
    command = [sys.executable, "-m", "replayrl", "vllm-serve", "--model", folder, "--port", str(port)]
    command += ["--max_model_len", "128", "--dtype", "float32"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    pin = None
    if SERVER_CORE is not None:  # every server process (API, engine core, worker) on that core, the trainer not
        env |= {"VLLM_CPU_OMP_THREADS_BIND": str(SERVER_CORE), "OMP_NUM_THREADS": "1"}
        pin = lambda: os.sched_setaffinity(0, {SERVER_CORE})  # noqa: E731 - inherited by the server's children
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, preexec_fn=pin)
    wait_for_server(f"http://127.0.0.1:{port}", 900, process)
    return process, (folder, port)


def pin_trainer() -> None:
    """With `--server-core`: this process (the trainer) on the cores the server does not use."""
    import os

    if SERVER_CORE is not None:
        os.sched_setaffinity(0, os.sched_getaffinity(0) - {SERVER_CORE})


def vllm_fields(server) -> dict:
    return dict(use_vllm=True, vllm_mode="server", vllm_server_port=server[1], vllm_importance_sampling_correction=True)


def timing(settings: list[str], steps: int, warmup: int, threads: int, work: Path, backend: str) -> dict:
    rows = []
    for setting in settings:
        shape = {k: SETTINGS[setting][k] for k in ("hidden_size", "num_layers")}
        process, server = start_server(setting, work, num_heads=2, **shape) if backend == "vllm" else (None, None)
        try:
            runs = {
                arm: run_arm(setting, arm, 0, steps + warmup, n, char_reward, work / f"{setting}-{arm}", server)
                for arm, n in (("sync", threads), ("async", max(1, threads // 2)))
            }
        finally:
            if process is not None:
                process.terminate()
                process.wait(120)
        sync_step = statistics.median(step_times(runs["sync"], warmup))
        gen = statistics.median(runs["sync"]["generation"][warmup:])
        rest = sync_step - gen
        limit = max(gen, rest)
        async_step = statistics.median(step_times(runs["async"], warmup))
        overlap = [o for o in runs["async"]["overlap"][warmup:] if o is not None]
        rows.append(
            dict(
                setting=setting,
                backend=backend,
                sync_step_s=round(sync_step, 4),
                generation_s=round(gen, 4),
                rest_s=round(rest, 4),
                limit_s=round(limit, 4),
                async_step_s=round(async_step, 4),
                async_vs_limit=round(async_step / limit, 3),
                async_vs_sync=round(async_step / sync_step, 3),
                overlap=round(statistics.median(overlap), 3) if overlap else None,
                worker_generation_s=round(statistics.median(runs["async"]["generation"][warmup:]), 4),
                trainer_wait_s=round(statistics.median(runs["async"]["trainer_wait"][warmup:]), 4),
                staleness=round(statistics.mean(runs["async"]["staleness"][warmup:]), 2),
            )
        )
    columns = list(rows[0])
    print_table(rows, columns, "sync vs async GRPO step (medians, seconds)")
    return dict(rows=rows)


def smooth(values: list[float]) -> list[float]:
    return [statistics.mean(values[max(0, i - WINDOW + 1) : i + 1]) for i in range(len(values))]


def builtin_job(arm: str, seed: int, steps: int, out: Path) -> dict:
    """`replayrl grpo`'s built-in job (warmed-up tiny addition policy, exact-match reward, replay buffer) for `steps`
    steps, without evaluation, logging every step; (wall-clock seconds, reward) per step."""
    import torch

    from replayrl.cli.grpo import build_trainer, parse_grpo_args

    torch.set_num_threads(1)
    argv = ["--seed", str(seed), "--max_steps", str(steps), "--logging_steps", "1", "--eval_strategy", "no"]
    argv += ["--save_strategy", "no", "--output_dir", str(out), "--async_generation", str(arm == "async").lower()]
    script, model_args, config = parse_grpo_args(argv)
    return _timed_run(build_trainer(script, model_args, config), arm, seed)


def _timed_run(trainer, arm: str, seed: int) -> dict:
    clock = StepClock()
    trainer.add_callback(clock.callback)
    start = time.perf_counter()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h and "loss" in h]
    rewards, generation = [h["reward"] for h in logs], [h.get("timing/generation", 0.0) for h in logs]
    return dict(arm=arm, seed=seed, stamps=[t - start for t in clock.stamps], rewards=rewards, generation=generation)


LONG_SERVER_MODEL = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 2}  # head_dim 32 for vLLM
VERBOSE = "{a} plus {b} is {s}, so {a}+{b}={s}"  # `long`: the built-in task's sum, in words around it


def long_job(task: str, arm: str, seed: int, steps: int, out: Path, overrides: dict | None = None, server=None) -> dict:
    """Learning tasks whose completions are long enough for generation to be about half of the synchronous step.

    - `long`: the built-in task (the same prompts, split, noisy teacher and exact-match 0/1 reward) with a longer
      completion, "7 plus 5 is 12, so 7+5=12": the policy is warmed up on the teacher's answers in that format
      (`VERBOSE`), and a completion earns 1.0 only when it is exactly the format with the true sum. Same GRPO
      settings as the built-in job, `max_completion_length` 32.
    - `sparse_long`: sparse, from a random-init policy: the first character of the completion must equal the
      prompt's first character (`replay_sparse.py`'s `echo`), completions up to 16 tokens (a random policy rarely
      stops early), learning rate 3e-3, no KL term, the replay trainer's defaults.

    `server`: generate with that `replayrl vllm-serve` server (`LONG_SERVER_MODEL`'s shape; the trainer pushes its
    weights before the first batch).
    """
    import torch
    from datasets import Dataset

    from replayrl import GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
    from replayrl.models.tiny import build_tiny_model, build_tokenizer
    from replayrl.rewards.builtin import exact_match
    from replayrl.tasks import addition

    torch.set_num_threads(1)
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=seed, **(LONG_SERVER_MODEL if server else addition.MODEL_KWARGS))
    if server is not None:
        pin_trainer()
    train, _ = addition.task_datasets(seed)
    common = dict(output_dir=str(out), max_steps=steps, logging_steps=1, save_strategy="no", report_to="none")
    common |= dict(seed=seed, disable_tqdm=True, async_generation=arm == "async", use_cpu=True)
    common |= vllm_fields(server) if server is not None else {}
    if task == "long":

        def verbose(prompt: str, answer: str) -> str:
            a, b = prompt[:-1].split("+")
            return VERBOSE.format(a=a, b=b, s=answer)

        examples = [(p, verbose(p, c)) for p, c in addition.teacher_examples(seed)]
        with torch.random.fork_rng(devices=[]):
            addition.warm_up(model, tok, seed, examples=examples)
        train = train.map(lambda row: {"answer": verbose(row["prompt"], row["answer"])})
        settings = {k: v for k, v in addition.DEFAULT_CONFIG.items() if not k.startswith(("eval", "per_device_eval"))}
        settings = settings | {"max_completion_length": 32, "logging_steps": 1, "save_steps": steps + 1}
        reward = exact_match
    else:
        train = Dataset.from_dict({"prompt": train["prompt"]})
        settings = dict(per_device_train_batch_size=128, num_generations=8, max_prompt_length=16)
        settings |= dict(max_completion_length=16, learning_rate=3e-3, lr_scheduler_type="constant", beta=0.0)

        def echo(prompts, completions, **kwargs) -> list[float]:
            return [float(c[:1] == p[:1]) for p, c in zip(prompts, completions)]

        reward = echo
    args = GRPOWithReplayBufferConfig(**(settings | common | (overrides or {})))
    trainer = GRPOWithReplayBufferTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=train, processing_class=tok
    )
    return _timed_run(trainer, arm, seed)


def learning(
    seeds, steps: int, budget: float, work: Path, task: str = "builtin", overrides=None, backend="transformers"
):
    """On `task` (`builtin`, or `long_job`'s `long` / `sparse_long`), per seed: R = 0.9 x the synchronous run's
    final moving-average reward; seconds each arm takes to reach R, and
    each arm's moving-average reward after `budget` seconds (`budget` 0: the synchronous run's half-time)."""
    if backend == "vllm" and task == "builtin":
        raise ValueError("--backend vllm --mode learning runs the long tasks: add --task long or --task sparse_long")
    process, server = start_server(task, work, **LONG_SERVER_MODEL) if backend == "vllm" else (None, None)
    try:
        rows = [learning_row(task, seed, steps, budget, work, overrides, server) for seed in seeds]
    finally:
        if process is not None:
            process.terminate()
            process.wait(120)
    print_table(rows, list(rows[0]), f"{task}, {steps} steps, {backend}: wall-clock to 0.9 x the sync final reward")
    return dict(rows=rows)


def learning_row(task: str, seed: int, steps: int, budget: float, work: Path, overrides, server) -> dict:
    """One seed: both arms, then the figures of `learning`."""
    runs = {}
    for arm in ("sync", "async"):
        out = work / f"learn-{task}-{seed}-{arm}"
        if task == "builtin":
            runs[arm] = builtin_job(arm, seed, steps, out)
        else:
            runs[arm] = long_job(task, arm, seed, steps, out, overrides, server)
    target = 0.9 * smooth(runs["sync"]["rewards"])[-1]
    cut = budget or runs["sync"]["stamps"][-1] / 2
    row = dict(task=task, seed=seed, target=round(target, 3), budget_s=round(cut, 1))
    row |= step_figures(runs)
    for arm, run in runs.items():
        curve = smooth(run["rewards"])
        hit = next((i for i, r in enumerate(curve) if r >= target), None)
        row[f"{arm}_to_target_s"] = None if hit is None else round(run["stamps"][hit], 1)
        within = [r for r, t in zip(curve, run["stamps"]) if t <= cut]
        row[f"{arm}_at_budget"] = round(within[-1], 3) if within else None
        row[f"{arm}_final"] = round(curve[-1], 3)
        row[f"{arm}_total_s"] = round(run["stamps"][-1], 1)
        row[f"{arm}_first_step_s"] = round(run["stamps"][0], 1)  # async: includes starting the worker
    a, s = row["async_to_target_s"], row["sync_to_target_s"]
    row["async/sync_to_target"] = None if a is None or not s else round(a / s, 3)
    return row


def step_figures(runs: dict, skip: int = 10) -> dict:
    """Medians over the steps after the first `skip`: the synchronous step, its generation share, the overlap limit
    max(generation, rest) and the asynchronous step against it."""
    steps = {arm: step_times(run, skip) for arm, run in runs.items()}
    sync_step = statistics.median(steps["sync"])
    gen = statistics.median(runs["sync"]["generation"][skip + 1 :])
    limit = max(gen, sync_step - gen)
    async_step = statistics.median(steps["async"])
    return dict(
        sync_step_s=round(sync_step, 4),
        sync_gen_share=round(gen / sync_step, 3),
        async_vs_limit=round(async_step / limit, 3),
        async_vs_sync_step=round(async_step / sync_step, 3),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["timing", "learning"], default="timing")
    parser.add_argument("--settings", nargs="+", default=["short", "long"])
    parser.add_argument("--task", choices=["builtin", "long", "sparse_long"], default="builtin", help="learning mode")
    parser.add_argument("--budget", type=float, default=0.0, help="learning: seconds for 'reward after a budget'")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads of the sync run; the async run: half each side"
    )
    parser.add_argument(
        "--backend", choices=["transformers", "vllm"], default="transformers", help="vllm: run from .venv-vllm"
    )
    parser.add_argument(
        "--server-core", type=int, default=None, help="vllm: bind the server to this core, the trainer to the others"
    )
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="learning, long tasks: config overrides (JSON values)"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tag", default="")
    a = parser.parse_args()
    global SERVER_CORE
    SERVER_CORE = a.server_core
    if a.quick:
        a.steps, a.warmup, a.settings, a.seeds = 4, 1, ["short"], [0]
        a.steps = 6 if a.mode == "learning" else a.steps
    with tempfile.TemporaryDirectory() as tmp:
        if a.mode == "timing":
            payload = timing(a.settings, a.steps, a.warmup, a.threads, Path(tmp), a.backend)
        else:
            overrides = {k: json.loads(v) for k, v in (item.split("=", 1) for item in a.set)}
            payload = learning(a.seeds, a.steps, a.budget, Path(tmp), a.task, overrides, a.backend)
    payload["args"] = vars(a)
    name = (
        f"async_grpo_{a.mode}"
        + (f"_{a.task}" if a.mode == "learning" and a.task != "builtin" else "")
        + (f"_{a.tag}" if a.tag else "")
    )
    print(json.dumps(payload)[:200], "->", write_results(name, payload, quick=a.quick))


if __name__ == "__main__":
    main()
