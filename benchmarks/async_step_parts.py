"""Where a step of the `long` learning job goes, synchronous and asynchronous: median step time and the logged parts.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/async_step_parts.py --steps 20 --repeats 3

Runs `benchmarks/async_grpo.py`'s `long` job (the built-in task's settings, `beta=0.04`, a frozen reference model,
32-token completions) for `--steps` steps per arm, the arms alternating, and prints one JSON line per run and the
medians over runs of: the step's wall-clock time (steps after the first `--skip`), `timing/generation`,
`timing/logps` (the trainer's reference forward), `timing/optimization`, `async/trainer_wait` and
`async/producer_ref_logps` (the worker's reference forward, docs/async.md). Run it in two checkouts to compare
them (it reads what their metrics.jsonl holds; a metric a checkout does not log reads 0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.async_grpo import long_job  # noqa: E402

PARTS = ["timing/generation", "timing/logps", "timing/optimization", "async/trainer_wait", "async/producer_ref_logps"]


def one_run(arm: str, steps: int, skip: int, out: Path, seed: int) -> dict:
    run = long_job("long", arm, seed, steps, out)
    stamps = run["stamps"]
    step_times = [b - a for a, b in zip(stamps, stamps[1:])][skip - 1 :]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl") if '"loss"' in line][skip:]
    parts = {k: statistics.median([r.get(k, 0.0) for r in rows]) for k in PARTS}
    return dict(arm=arm, step=statistics.median(step_times), **parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--skip", type=int, default=5, help="first steps left out (warm-up, worker start)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for repeat in range(args.repeats):
            for arm in ("sync", "async"):
                result = one_run(arm, args.steps, args.skip, Path(work) / f"{arm}{repeat}", args.seed)
                runs.append(result)
                print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))
    for arm in ("sync", "async"):
        mine = [r for r in runs if r["arm"] == arm]
        medians = {k: round(statistics.median([r[k] for r in mine]), 4) for k in ["step", *PARTS]}
        print(json.dumps({"arm": arm, "median_of": len(mine), **medians}))


if __name__ == "__main__":
    main()
