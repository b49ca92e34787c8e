"""PPO (value head) vs GRPO with and without the replay buffer, on the same task and the same budget of
completions generated.

    python benchmarks/ppo_vs_grpo.py                # 2 seeds x {PPO, GRPO, GRPO + replay}, 6,400 completions each
    python benchmarks/ppo_vs_grpo.py --quick        # smoke run: 1 seed, 640 completions

Task: `replayrl.tasks.addition` (the built-in job of `replayrl grpo` and `replayrl ppo`), the same warmed-up
tiny Qwen2 per seed for every arm. PPO: `replayrl ppo`'s built-in settings (64 prompts x 1 completion per step,
mini-batches of 32, 4 PPO epochs, lr 3e-4, fixed KL coefficient 0.05), `PPOTrainer.train()`. GRPO arms: the
settings of `benchmarks/sample_efficiency.py` (the GRPO built-in job: 16 prompts x 8 completions per step,
lr 1e-3, beta 0.04; the replay arm with its buffer). Budget: the same number of completions generated, so PPO
takes twice as many steps as GRPO (64 vs 128 completions per step); each PPO step makes 8 optimizer updates,
each GRPO step one.

Reported: the training reward (mean exact-match of the freshly generated completions) against completions
generated, the greedy success rate on the 20 held-out and the 80 training prompts at the start and the end, and
wall time per run. Writes benchmarks/results/ppo_vs_grpo.{json,png}.
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
from sample_efficiency import _band, _mean, greedy_success, run_arm, smooth  # noqa: E402

ARMS = ("ppo", "grpo", "replay")
GRPO_COMPLETIONS_PER_STEP = 128


def run_ppo(seed: int, base_model, tokenizer, completions: int, output_dir: str) -> dict:
    from replayrl import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
    from replayrl.cli.ppo import BUILTIN_CONFIG, BUILTIN_GENERATION
    from replayrl.metrics import read_metrics
    from replayrl.tasks.addition import task_datasets, task_reward

    settings = {**BUILTIN_CONFIG, "steps": completions, "logging_steps": 1, "seed": seed, "output_dir": output_dir}
    config = PPOConfig(**settings)
    train, held_out = task_datasets(seed)
    reward = task_reward()
    lm = copy.deepcopy(base_model)
    model = AutoModelForCausalLMWithValueHead.from_pretrained(lm)
    trainer = PPOTrainer(config, model, None, tokenizer, dataset=train)
    width = BUILTIN_GENERATION["max_new_tokens"]
    evals = [
        (0, greedy_success(lm, tokenizer, held_out, reward, width), greedy_success(lm, tokenizer, train, reward, width))
    ]
    start = time.perf_counter()
    trainer.train([reward], generation_kwargs=BUILTIN_GENERATION)
    seconds = time.perf_counter() - start
    steps = config.total_ppo_epochs
    evals.append(
        (
            steps,
            greedy_success(lm, tokenizer, held_out, reward, width),
            greedy_success(lm, tokenizer, train, reward, width),
        )
    )
    records = read_metrics(Path(output_dir) / "metrics.jsonl")
    return {
        "arm": "ppo",
        "seed": seed,
        "completions_per_step": config.batch_size,
        "reward": [r["reward"] for r in records],
        "greedy_success": evals,
        "seconds": seconds,
    }


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for arm in ARMS:
        arm_runs = [r for r in runs if r["arm"] == arm]
        if not arm_runs:
            continue
        n = len(arm_runs[0]["reward"])
        tail = max(1, n // 5)
        rows.append(
            {
                "arm": arm,
                "seeds": len(arm_runs),
                "completions": n * arm_runs[0]["completions_per_step"],
                "steps": n,
                "reward_first_20pct": median(_mean(r["reward"][:tail]) for r in arm_runs),
                "reward_last_20pct": median(_mean(r["reward"][-tail:]) for r in arm_runs),
                "held_out_start": median(r["greedy_success"][0][1] for r in arm_runs),
                "held_out_end": median(r["greedy_success"][-1][1] for r in arm_runs),
                "train_prompts_end": median(r["greedy_success"][-1][2] for r in arm_runs),
                "seconds": median(r["seconds"] for r in arm_runs),
            }
        )
    return rows


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colours = {"ppo": "tab:green", "grpo": "tab:blue", "replay": "tab:orange"}
    labels = {"ppo": "PPO (value head)", "grpo": "GRPO", "replay": "GRPO + replay buffer"}
    for arm in ARMS:
        arm_runs = [r for r in runs if r["arm"] == arm]
        if not arm_runs:
            continue
        per_step = arm_runs[0]["completions_per_step"]
        window = max(1, 1280 // per_step)  # smooth over the same number of completions for every arm
        curves = [smooth(r["reward"], window) for r in arm_runs]
        _band(ax, [(i + 1) * per_step for i in range(len(curves[0]))], curves, colours[arm], labels[arm])
    ax.set_title("training reward (success rate of sampled completions), moving average of 1,280", fontsize=9)
    ax.set_xlabel("completions generated")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 1 seed, 640 completions")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 (quick: 0)")
    p.add_argument("--completions", type=int, default=None, help="budget per run (default 6400; quick 640)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--tag", default="", help="suffix of the result files (e.g. a GRPO-only run at another budget)")
    args = p.parse_args(argv)
    import torch
    import transformers

    from replayrl.tasks.addition import build_default_model

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    seeds = args.seeds or ([0] if args.quick else [0, 1])
    budget = args.completions or (640 if args.quick else 6400)
    work = Path(tempfile.mkdtemp(prefix="replayrl-ppo-vs-grpo-"))
    name = "ppo_vs_grpo" + (f"_{args.tag}" if args.tag else "")
    runs = []
    for seed in seeds:
        base_model, tokenizer = build_default_model(seed)
        for arm in args.arms:
            out = str(work / f"{arm}-{seed}")
            if arm == "ppo":
                run = run_ppo(seed, base_model, tokenizer, budget, out)
            else:
                steps = budget // GRPO_COMPLETIONS_PER_STEP
                run = run_arm(arm, seed, base_model, tokenizer, steps, steps, out)
            runs.append(run)
            print(
                f"  seed {seed} {arm:6s}: reward {_mean(run['reward'][:5]):.3f} -> {_mean(run['reward'][-5:]):.3f} "
                f"(first/last 5 steps), greedy held-out {run['greedy_success'][0][1]:.2f} -> "
                f"{run['greedy_success'][-1][1]:.2f} ({run['seconds']:.0f} s)",
                flush=True,
            )
            rows = summarize(runs)
            payload = {"completions": budget, "seeds": seeds, "rows": rows, "runs": runs}
            write_results(name, payload, quick=args.quick)  # after every run: partial results survive
    table = print_table(rows, list(rows[0]), title=f"\nPPO vs GRPO, {budget} completions per run, medians over seeds")
    plot(runs, RESULTS_DIR / f"{name}{'_quick' if args.quick else ''}.png")
    write_results(
        name,
        {"completions": budget, "seeds": seeds, "rows": rows, "table": table, "runs": runs},
        quick=args.quick,
    )
    remove_scratch(work)


if __name__ == "__main__":
    main()
