"""Where a replayrl GRPO step goes: median seconds per optimizer step after warm-up, split into parts.

    python benchmarks/step_time.py            # tiny + larger, beta 0.04 and 0.0, 2 rounds
    python benchmarks/step_time.py --quick    # smoke run

Runs `GRPOWithReplayBufferTrainer` (TRL's replay example: the reward is all zeros for 25% of the batches,
else uniform noise; buffer of 8 groups for `tiny`, 64 for `larger`) in fresh worker processes (`grpo_worker.py`),
the betas alternating within each round. Parts of a step (seconds; see `grpo_worker.py`): generation, logps
(no-grad reference pass when beta > 0), loss_fwd (forward with grad + loss), backward, optimizer, replay (buffer
bookkeeping), rewards, other. Also tokens per second (prompt + completion tokens, as the `num_tokens` metric),
peak RSS and, on CUDA, peak GPU memory. Figures are medians over the timed steps, then over rounds.
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
    remove_scratch,
    run_worker,
    summarize_run,
    write_results,
)

PARTS = ["generation", "logps", "loss_fwd", "backward", "optimizer", "replay", "rewards", "other"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: fewer steps, one round")
    p.add_argument("--configs", nargs="+", default=["tiny", "larger"], choices=sorted(CONFIGS))
    p.add_argument("--betas", nargs="+", type=float, default=[0.04, 0.0])
    p.add_argument("--rounds", type=int, default=None, help="runs per (config, beta) (default 2, quick 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: stable on a shared CPU)")
    args = p.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 2)

    work = Path(tempfile.mkdtemp(prefix="replayrl-step-time-"))
    runs, rows = [], []
    for config in args.configs:
        cfg = CONFIGS[config]
        model_dir, data_file = prepare_assets(work, config)
        steps = ["--warmup", str(cfg["quick_warmup" if args.quick else "warmup"])]
        steps += ["--steps", str(cfg["quick_steps" if args.quick else "steps"])]
        summaries: dict[float, list[dict]] = {beta: [] for beta in args.betas}
        for r in range(rounds):
            betas = args.betas if r % 2 == 0 else args.betas[::-1]
            for beta in betas:
                worker_args = ["--impl", "replayrl", "--config", config, "--beta", str(beta), "--seed", str(r)]
                worker_args += ["--replay-buffer-size", str(cfg["replay_buffer_size"])]
                worker_args += ["--model-dir", str(model_dir), "--data-file", str(data_file), *steps]
                result = run_worker(sys.executable, worker_args, work / f"{config}-b{beta}-r{r}.log", args.threads)
                summary = summarize_run(result)
                summaries[beta].append(summary)
                runs.append({"config": config, "beta": beta, "round": r, "summary": summary, "result": result})
                print(f"  {config} beta={beta} round {r}: {summary['step_s']:.4f} s/step", flush=True)
        rows += [summary_row(config, beta, s) for beta, s in summaries.items()]

    columns = ["config", "beta", "step_s", *PARTS, "tokens_per_s", "peak_rss_mib"]
    if any("peak_gpu_mib" in row for row in rows):
        columns.append("peak_gpu_mib")
    table = print_table(rows, columns, title="\nreplayrl seconds per optimizer step (medians), by part")
    shares = [
        {"config": r["config"], "beta": r["beta"], **{k: f"{100 * r[k] / r['step_s']:.1f}%" for k in PARTS}}
        for r in rows
    ]
    share_table = print_table(shares, ["config", "beta", *PARTS], title="\nshare of the step")
    write_results(
        "step_time",
        {
            "threads": args.threads,
            "rounds": rounds,
            "rows": rows,
            "table": table,
            "share_table": share_table,
            "runs": runs,
        },
        quick=args.quick,
    )
    remove_scratch(work)


def summary_row(config: str, beta: float, summaries: list[dict]) -> dict:
    keys = {k for s in summaries for k in s}
    row = {"config": config, "beta": beta}
    row.update({k: median(s[k] for s in summaries if k in s) for k in sorted(keys)})
    for part in PARTS:
        row.setdefault(part, 0.0)
    return row


if __name__ == "__main__":
    main()
