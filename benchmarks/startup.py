"""Start-up time of replayrl against TRL: what a user waits for before anything useful happens.

    python benchmarks/startup.py            # 10 rounds
    python benchmarks/startup.py --quick    # 3 rounds (writes results/startup_quick.json)

Four pairs, each command in a fresh process: `python -c "import replayrl"` / `python -c "import trl"`,
`replayrl --help` / `trl --help`, `from replayrl import GRPOTrainer` / `from trl import GRPOTrainer`, and
`replayrl grpo --help` / `trl grpo --help`. TRL runs in its own virtualenv (`benchmarks/.venv-trl`, created on first
use by `vs_trl.ensure_trl_venv`: the same torch, transformers, accelerate and datasets as this environment). Each
round runs every pair once, replayrl first in even rounds and TRL first in odd ones, after one untimed warm-up run
of every command (file-system cache). A figure is the median wall time over the rounds (min also kept);
ratio = replayrl / TRL (< 1: replayrl starts faster). replayrl is this checkout (PYTHONPATH=<repo>), run through
the `replayrl` console script next to this interpreter when there is one, else `python -m replayrl`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO_DIR, median, print_table, ratio, write_results  # noqa: E402

TARGET_S = 1.0  # issue 8: `replayrl --help` and `import replayrl` take at most 1 s ...
TARGET_RATIO = 2.0  # ... and no more than 2x TRL's `trl --help`


def console_script(python: Path, name: str) -> list[str]:
    """`name` as installed next to `python` (how users type it), else `python -m name`."""
    script = python.parent / name
    return [str(script)] if script.exists() else [str(python), "-m", name]


def pairs(replayrl_python: Path, trl_python: Path) -> list[tuple[str, list[str], list[str]]]:
    """(what, replayrl command, TRL command)."""
    ours, theirs = console_script(replayrl_python, "replayrl"), console_script(trl_python, "trl")
    return [
        ("import package", [str(replayrl_python), "-c", "import replayrl"], [str(trl_python), "-c", "import trl"]),
        ("--help", [*ours, "--help"], [*theirs, "--help"]),
        (
            "import GRPOTrainer",
            [str(replayrl_python), "-c", "from replayrl import GRPOTrainer"],
            [str(trl_python), "-c", "from trl import GRPOTrainer"],
        ),
        ("grpo --help", [*ours, "grpo", "--help"], [*theirs, "grpo", "--help"]),
    ]


def environments() -> dict[str, dict[str, str]]:
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    base.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    # replayrl: this checkout first on the path; TRL: nothing of this environment leaks in.
    return {"replayrl": {**base, "PYTHONPATH": str(REPO_DIR)}, "trl": base}


def time_once(cmd: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one fresh process; a failing command is an error (its stderr tail is shown)."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO_DIR)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed (rc={proc.returncode}):\n{proc.stderr[-2000:]}")
    return elapsed


def measure(commands: list[tuple[str, list[str], list[str]]], rounds: int) -> dict[str, dict[str, list[float]]]:
    """times[what][side] = wall seconds per round, replayrl and TRL alternating which goes first."""
    envs = environments()
    for _, ours, theirs in commands:  # warm-up: file-system cache, .pyc files
        time_once(ours, envs["replayrl"])
        time_once(theirs, envs["trl"])
    times = {what: {"replayrl": [], "trl": []} for what, _, _ in commands}
    for r in range(rounds):
        for what, ours, theirs in commands:
            order = [("replayrl", ours), ("trl", theirs)]
            for side, cmd in order if r % 2 == 0 else order[::-1]:
                times[what][side].append(time_once(cmd, envs[side]))
        print(
            f"  round {r + 1}/{rounds}: "
            + ", ".join(f"{w} {t['replayrl'][-1]:.2f}/{t['trl'][-1]:.2f} s" for w, t in times.items()),
            flush=True,
        )
    return times


def summarize(commands, times) -> list[dict]:
    rows = []
    for what, ours, theirs in commands:
        t = times[what]
        row = {"what": what, "replayrl_s": median(t["replayrl"]), "trl_s": median(t["trl"])}
        row["ratio"] = ratio(row["replayrl_s"], row["trl_s"])
        row["replayrl_min_s"], row["trl_min_s"] = min(t["replayrl"]), min(t["trl"])
        row["replayrl_cmd"], row["trl_cmd"] = " ".join(map(_short, ours)), " ".join(map(_short, theirs))
        rows.append(row)
    return rows


def _short(part: str) -> str:
    """`/long/path/.venv/bin/python` -> `python` in the printed commands."""
    return Path(part).name if os.sep in part else part


def _loadavg() -> list[str]:
    """1, 5 and 15-minute load averages (Linux; empty elsewhere): how busy the machine was."""
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[:3]
    except OSError:
        return []


def check_targets(rows: list[dict]) -> list[str]:
    """Issue 8's done-when lines, each `ok` or `MISSED`."""
    by = {r["what"]: r for r in rows}
    trl_help = by["--help"]["trl_s"]
    lines = []
    for what in ("import package", "--help"):
        ours = by[what]["replayrl_s"]
        ok = ours <= TARGET_S and ours <= TARGET_RATIO * trl_help
        lines.append(
            f"{'ok' if ok else 'MISSED'}: replayrl {what} {ours:.3f} s (target <= {TARGET_S:g} s and "
            f"<= {TARGET_RATIO:g} x trl --help = {TARGET_RATIO * trl_help:.3f} s)"
        )
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="3 rounds instead of 10")
    p.add_argument("--rounds", type=int, default=None, help="fresh processes per command (default 10, quick 3)")
    p.add_argument("--trl-python", default=None, help="use this interpreter for TRL instead of .venv-trl")
    args = p.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 10)
    if args.trl_python:
        trl_python = Path(args.trl_python)
    else:
        from vs_trl import ensure_trl_venv

        trl_python = ensure_trl_venv()
    # not resolved: a venv's python is a symlink, and its console scripts live next to the link
    replayrl_python = Path(sys.executable)
    commands = pairs(replayrl_python, trl_python)
    load_at_start = _loadavg()
    times = measure(commands, rounds)
    rows = summarize(commands, times)
    table = print_table(
        rows,
        ["what", "replayrl_s", "trl_s", "ratio", "replayrl_min_s", "trl_min_s"],
        title=f"\nstart-up, median of {rounds} fresh processes each (ratio = replayrl / TRL; < 1 is faster)",
    )
    targets = check_targets(rows)
    print("\n".join(targets), flush=True)
    write_results(
        "startup",
        {
            "rounds": rounds,
            "rows": rows,
            "times": times,
            "table": table,
            "targets": targets,
            "loadavg_before": load_at_start,
            "loadavg_after": _loadavg(),
        },
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
