"""Does replay learn more per generated completion? Reward and success rate against completions generated,
GRPO with and without the replay buffer, over several seeds.

    python benchmarks/sample_efficiency.py            # 3 seeds x {GRPO, GRPO + replay}, the default job's steps
    python benchmarks/sample_efficiency.py --quick    # smoke run: 1 seed, 20 steps
    python benchmarks/sample_efficiency.py --arms grpo rloo --steps 200 --output rloo_vs_grpo   # RLOO next to GRPO

Task: `replayrl.tasks.addition` (the built-in default job): single-digit addition "a+b=" (80 training prompts, 20
held out), 0/1 exact-match reward, a tiny Qwen2 warmed up on a noisy teacher so that it starts right about a
quarter of the time. Both arms use the same seeds, the same warmed-up model per seed and the job's GRPO settings
(`default_task.DEFAULT_CONFIG`, its own evaluation and checkpointing switched off); the replay arm keeps the job's
replay buffer, the plain arm is `GRPOTrainer`. Replay does not change how many completions a step generates, so
the x axis is optimizer steps times the completions generated per step. The `rloo` arm is `RLOOTrainer` with the same
settings (those of `replayrl rloo`'s built-in job: beta 0.05, in the reward as TRL's RLOO, no replay buffer).

Per step we record the training reward (mean over the freshly generated completions = their success rate), the
fraction of zero-std groups in the generated batch, and the fraction of zero-std groups actually trained on (after
the replay swap; equal to the former without replay). Every `--eval-every` steps, the greedy success rate on the
20 held-out prompts and on the 80 training prompts. Writes benchmarks/results/sample_efficiency.{json,png}.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, median, print_table, remove_scratch, write_results  # noqa: E402

# arm -> replay settings on top of the default job's (None: plain GRPOTrainer). Knobs whose library default changed
# are spelled out: "replay" is the job with TRL's replay objective and no reuse bound (the job sets max age 10), as
# measured before the change; "default" takes GRPOWithReplayBufferConfig's current defaults under the job's settings.
_SEED = {"replay_max_reuse": None, "replay_importance_cap": None}
ARM_SETTINGS: dict[str, dict | None] = {
    "grpo": None,
    "replay": _SEED,
    "default": {},
    "replay_tis": {**_SEED, "replay_importance_cap": 2.0},
    "replay_mix_tis": {**_SEED, "replay_strategy": "mix", "replay_importance_cap": 2.0},
    "replay_fresh_tis": {"replay_importance_cap": 2.0, "replay_max_age": 4, "replay_max_reuse": 2},
    "replay_mix_group_tis": {**_SEED, "replay_strategy": "mix_then_group", "replay_importance_cap": 2.0},
    "rloo": None,  # RLOOTrainer (no replay buffer), `replayrl rloo`'s settings: the job's, beta 0.05 in the reward
}
ARMS = tuple(ARM_SETTINGS)


def greedy_success(model, tokenizer, dataset, reward, max_new_tokens: int) -> float:
    """Exact-match rate of greedy completions over the whole dataset."""
    import torch

    prompts, answers = list(dataset["prompt"]), list(dataset["answer"])
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(
            **enc.to(model.device), do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id
        )
    model.train(was_training)
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    scores = reward(completions=texts, answer=answers, prompts=prompts)
    return sum(s or 0.0 for s in scores) / len(scores)


def run_arm(arm: str, seed: int, base_model, tokenizer, steps: int, eval_every: int, output_dir: str) -> dict:
    from transformers import PrinterCallback, TrainerCallback

    from replayrl import GRPOConfig, GRPOTrainer, GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
    from replayrl.tasks.addition import DEFAULT_CONFIG, task_datasets, task_reward

    own_eval = ("save_", "logging_", "eval_", "per_device_eval_")  # the job's evaluation/checkpoints: ours instead
    settings = {k: v for k, v in DEFAULT_CONFIG.items() if not k.startswith(own_eval)}
    settings.update(max_steps=steps, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True)
    settings.update(seed=seed, output_dir=output_dir, use_cpu=True)
    replay = {k: settings.pop(k) for k in list(settings) if k.startswith("replay_")}
    if arm == "rloo":
        from replayrl import RLOOConfig, RLOOTrainer

        settings.update(beta=0.05, bf16=False, gradient_checkpointing=False)  # RLOOConfig: TRL's bf16/GC defaults
        config, cls = RLOOConfig(**settings), RLOOTrainer
    elif ARM_SETTINGS[arm] is not None:
        replay.update(ARM_SETTINGS[arm])
        config, cls = GRPOWithReplayBufferConfig(**settings, **replay), GRPOWithReplayBufferTrainer
    else:
        config, cls = GRPOConfig(**settings), GRPOTrainer
    train, held_out = task_datasets(seed)
    reward = task_reward()
    model = copy.deepcopy(base_model)
    evals: list[tuple[int, float, float]] = []  # (step, held-out success, training-prompt success)

    def evaluate(step: int) -> None:
        width = config.max_completion_length
        held = greedy_success(model, tokenizer, held_out, reward, width)
        evals.append((step, held, greedy_success(model, tokenizer, train, reward, width)))

    class GreedyEval(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            evaluate(0)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % eval_every == 0 or state.global_step == state.max_steps:
                evaluate(state.global_step)

    trainer = cls(
        model=model,
        reward_funcs=[reward],
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[GreedyEval()],
    )
    trainer.remove_callback(PrinterCallback)  # one log line per step otherwise
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    logs = [h for h in trainer.state.log_history if "reward" in h]
    zero = [h["frac_reward_zero_std"] for h in logs]
    trained = [h.get("replay/frac_zero_std_trained", h["frac_reward_zero_std"]) for h in logs]
    return {
        "arm": arm,
        "seed": seed,
        "completions_per_step": config.per_device_train_batch_size * config.gradient_accumulation_steps,
        "reward": [h["reward"] for h in logs],
        "frac_zero_std": zero,
        "frac_zero_std_trained": trained,
        "groups_replaced": [h.get("replay/groups_replaced", 0.0) for h in logs],
        "greedy_success": evals,
        "seconds": seconds,
    }


def summarize(runs: list[dict], thresholds: list[float], window: int) -> list[dict]:
    rows = []
    for arm in ARMS:
        arm_runs = [r for r in runs if r["arm"] == arm]
        if not arm_runs:
            continue
        per_step = arm_runs[0]["completions_per_step"]
        n = len(arm_runs[0]["reward"])
        tail = max(1, n // 5)
        rows.append(
            {
                "arm": arm,
                "seeds": len(arm_runs),
                "completions": n * per_step,
                "reward_first_10": median(sum(r["reward"][:10]) / len(r["reward"][:10]) for r in arm_runs),
                "reward_last_20pct": median(sum(r["reward"][-tail:]) / tail for r in arm_runs),
                "held_out_start": median(r["greedy_success"][0][1] for r in arm_runs),
                "held_out_end": median(r["greedy_success"][-1][1] for r in arm_runs),
                "train_prompts_end": median(r["greedy_success"][-1][2] for r in arm_runs),
                **{f"to_{t}": _completions_to(arm_runs, t, window) for t in thresholds},
                "zero_std_generated": median(_mean(r["frac_zero_std"]) for r in arm_runs),
                "zero_std_trained": median(_mean(r["frac_zero_std_trained"]) for r in arm_runs),
                "seconds": median(r["seconds"] for r in arm_runs),
            }
        )
    return rows


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _completions_to(runs: list[dict], threshold: float, window: int) -> float | str:
    """Median over seeds of the completions generated until the smoothed training reward first reaches
    `threshold` ('n/k' when only n of the k seeds got there)."""
    steps = [_first_reaching(smooth(r["reward"], window), threshold) for r in runs]
    reached = [s * r["completions_per_step"] for s, r in zip(steps, runs) if s is not None]
    return median(reached) if len(reached) == len(runs) else f"{len(reached)}/{len(runs)}"


def _first_reaching(values: list[float], threshold: float) -> int | None:
    """1-based step at which `values` first reaches `threshold`."""
    return next((i + 1 for i, v in enumerate(values) if v >= threshold), None)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def plot(runs: list[dict], path: Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colours = {"grpo": "tab:blue", "replay": "tab:orange", "replay_tis": "tab:green", "replay_mix_tis": "tab:red"}
    colours.update(replay_fresh_tis="tab:purple", default="tab:brown", replay_mix_group_tis="tab:pink")
    colours["rloo"] = "tab:olive"
    labels = {"grpo": "GRPO", "replay": "GRPO + replay buffer", "replay_tis": "replay, importance cap 2"}
    labels["replay_mix_tis"] = "replay mix, importance cap 2"
    labels["replay_fresh_tis"] = "replay, cap 2, max age 4, max reuse 2"
    labels["default"] = "replay, current defaults"
    labels["replay_mix_group_tis"] = "replay mix_then_group, cap 2"
    labels["rloo"] = "RLOO (leave-one-out baseline)"
    for arm in ARMS:
        arm_runs = [r for r in runs if r["arm"] == arm]
        if not arm_runs:
            continue
        per_step = arm_runs[0]["completions_per_step"]
        for key, ax in (("reward", axes[0]), ("frac_zero_std_trained", axes[2])):
            curves = [smooth(r[key], window) for r in arm_runs]
            x = [(i + 1) * per_step for i in range(len(curves[0]))]
            _band(ax, x, curves, colours[arm], labels[arm])
        curves = [[e[1] for e in r["greedy_success"]] for r in arm_runs]
        x = [e[0] * per_step for e in arm_runs[0]["greedy_success"]]
        _band(axes[1], x, curves, colours[arm], labels[arm], marker="o")
    n_seeds = len({r["seed"] for r in runs})
    titles = [
        f"training reward (= success rate of sampled completions)\nmoving average of {window} steps",
        "greedy success rate on the 20 held-out prompts",
        f"fraction of zero-std groups trained on\nmoving average of {window} steps",
    ]
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("completions generated")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"replayrl default task (single-digit addition), median and range over {n_seeds} seed(s)", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", flush=True)


def _band(ax, x, curves, colour, label, marker=None) -> None:
    n = min(len(c) for c in curves)
    columns = [[c[i] for c in curves] for i in range(n)]
    ax.plot(x[:n], [median(col) for col in columns], color=colour, label=label, marker=marker, markersize=3)
    if len(curves) > 1:
        ax.fill_between(x[:n], [min(col) for col in columns], [max(col) for col in columns], color=colour, alpha=0.2)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 1 seed, 20 steps")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 (quick: 0)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: the default job's)")
    p.add_argument("--eval-every", type=int, default=None, help="greedy evaluation period in steps (default 25)")
    p.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        default=[0.6, 0.7, 0.8, 0.85],
        help="report the completions generated until the smoothed training reward reaches each of these",
    )
    p.add_argument("--arms", nargs="+", default=["grpo", "replay"], choices=ARMS, help="default: grpo replay")
    p.add_argument("--output", default="sample_efficiency", help="results name (benchmarks/results/<name>.json)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: stable on a shared CPU)")
    args = p.parse_args(argv)
    import torch
    import transformers

    from replayrl.tasks.addition import DEFAULT_CONFIG, build_default_model

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    steps = args.steps or (20 if args.quick else DEFAULT_CONFIG["max_steps"])
    eval_every = args.eval_every or (5 if args.quick else 25)

    work = Path(tempfile.mkdtemp(prefix="replayrl-sample-efficiency-"))
    runs = []
    for seed in seeds:
        base_model, tokenizer = build_default_model(seed)
        for arm in args.arms if seed % 2 == 0 else args.arms[::-1]:
            run = run_arm(arm, seed, base_model, tokenizer, steps, eval_every, str(work / f"{arm}-{seed}"))
            runs.append(run)
            print(
                f"  seed {seed} {arm:6s}: reward first/last 10 steps {_mean(run['reward'][:10]):.3f} -> "
                f"{_mean(run['reward'][-10:]):.3f}, greedy held-out {run['greedy_success'][0][1]:.2f} -> "
                f"{run['greedy_success'][-1][1]:.2f} ({run['seconds']:.0f} s)",
                flush=True,
            )
    window = 5 if args.quick else 20  # moving average of the training reward, in steps
    rows = summarize(runs, args.thresholds, window)
    columns = list(rows[0])
    table = print_table(rows, columns, title="\nsample efficiency, medians over seeds")
    plot(runs, RESULTS_DIR / f"{args.output}{'_quick' if args.quick else ''}.png", window=window)
    payload = {"steps": steps, "seeds": seeds, "rows": rows, "table": table, "runs": runs}
    write_results(args.output, payload, quick=args.quick)
    remove_scratch(work)


if __name__ == "__main__":
    main()
