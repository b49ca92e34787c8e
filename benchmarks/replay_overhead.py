"""What the replay buffer costs: GRPO vs GRPO-with-replay, same config and seeds, alternating runs.

    python benchmarks/replay_overhead.py            # tiny (5 rounds) + larger (3 rounds)
    python benchmarks/replay_overhead.py --quick    # smoke run

Each round runs plain `GRPOTrainer` and `GRPOWithReplayBufferTrainer` (TRL's replay example: the reward is
all zeros for 25% of the batches, else uniform noise) with the same seed, in fresh worker processes, alternating
which goes first. Reported: the ratio of median step times (replay / plain; the medians are over rounds of the
per-run medians), and the share of a replay step spent in the buffer's bookkeeping (`_postprocess_rollout`, which
swaps zero-std groups for buffered ones, plus `_after_first_pass`, which stores informative groups), summed over
the timed steps of a run, median over runs. Target: under 3%.

The step-time ratio also includes what replay changes downstream: replayed groups are re-padded into the batch,
so the loss passes can be a little wider.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    CONFIGS,
    median,
    prepare_assets,
    print_table,
    ratio,
    remove_scratch,
    run_worker,
    summarize_run,
    write_results,
)

TARGET_SHARE = 0.03


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: fewer steps, 2 rounds, tiny only")
    p.add_argument("--configs", nargs="+", default=None, choices=sorted(CONFIGS), help="default: tiny larger")
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--rounds", type=int, default=None, help="default: 5 for tiny, 3 for larger (quick: 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: stable on a shared CPU)")
    args = p.parse_args(argv)
    configs = args.configs or (["tiny"] if args.quick else ["tiny", "larger"])

    work = Path(tempfile.mkdtemp(prefix="replayrl-replay-overhead-"))
    rows, runs = [], []
    for config in configs:
        cfg = CONFIGS[config]
        rounds = args.rounds or (2 if args.quick else (5 if config == "tiny" else 3))
        model_dir, data_file = prepare_assets(work, config)
        steps = ["--warmup", str(cfg["quick_warmup" if args.quick else "warmup"])]
        steps += ["--steps", str(cfg["quick_steps" if args.quick else "steps"])]
        sides: dict[str, list[dict]] = {"grpo": [], "replay": []}
        for r in range(rounds):
            order = ["grpo", "replay"] if r % 2 == 0 else ["replay", "grpo"]
            for side in order:
                size = cfg["replay_buffer_size"] if side == "replay" else 0
                worker_args = ["--impl", "replayrl", "--config", config, "--beta", str(args.beta), "--seed", str(r)]
                worker_args += ["--replay-buffer-size", str(size), "--model-dir", str(model_dir)]
                worker_args += ["--data-file", str(data_file), *steps]
                result = run_worker(sys.executable, worker_args, work / f"{config}-{side}-r{r}.log", args.threads)
                summary = summarize_run(result)
                summary["replay_share"] = sum(s.get("replay", 0.0) for s in result["steps"]) / sum(
                    s["step"] for s in result["steps"]
                )
                logged = result["logged"]
                summary["frac_zero_std"] = _mean(logged.get("frac_reward_zero_std", []))
                summary["frac_zero_std_trained"] = _mean(logged.get("replay/frac_zero_std_trained", []))
                sides[side].append(summary)
                runs.append({"config": config, "round": r, "side": side, "summary": summary, "result": result})
                print(f"  {config} round {r} {side:6s} {summary['step_s']:.4f} s/step", flush=True)
        rows.append(overhead_row(config, rounds, sides))

    columns = ["config", "rounds", "grpo_s", "replay_s", "step_ratio", "replay_share", "share_ok"]
    columns += ["bookkeeping_ms", "frac_zero_std", "frac_zero_std_trained", "grpo_rss", "replay_rss"]
    table = print_table(rows, columns, title="\nGRPO with replay vs plain GRPO (ratio = replay / plain)")
    write_results(
        "replay_overhead",
        {"beta": args.beta, "threads": args.threads, "rows": rows, "table": table, "runs": runs},
        quick=args.quick,
    )
    remove_scratch(work)


def overhead_row(config: str, rounds: int, sides: dict[str, list[dict]]) -> dict:
    grpo, replay = sides["grpo"], sides["replay"]
    share = median(s["replay_share"] for s in replay)
    return {
        "config": config,
        "rounds": rounds,
        "grpo_s": median(s["step_s"] for s in grpo),
        "replay_s": median(s["step_s"] for s in replay),
        "step_ratio": ratio(median(s["step_s"] for s in replay), median(s["step_s"] for s in grpo)),
        "replay_share": f"{100 * share:.2f}%",
        "replay_share_value": share,
        "share_ok": "yes" if share < TARGET_SHARE else "NO",
        "bookkeeping_ms": 1000 * median(s.get("replay", 0.0) for s in replay),
        "frac_zero_std": median(s["frac_zero_std"] for s in replay),
        "frac_zero_std_trained": median(s["frac_zero_std_trained"] for s in replay),
        "grpo_rss": median(s["peak_rss_mib"] for s in grpo),
        "replay_rss": median(s["peak_rss_mib"] for s in replay),
        "grpo_per_round_s": [s["step_s"] for s in grpo],
        "replay_per_round_s": [s["step_s"] for s in replay],
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


if __name__ == "__main__":
    main()
