"""replayrl vs TRL `SFTTrainer`: tokens/s and peak RSS on the same model, data and settings, with and without
packing; and the packing speed-up of each library.

Model: the `larger` tiny Qwen2 of `common.CONFIGS` (hidden 256, 4 layers, character tokenizer), fp32, CPU, one
torch thread per worker. Data: 1024 language-modeling documents of 16-256 characters (= tokens), uniform, fixed
seed; `max_length` 256, per-device batch 8. Each run is a fresh process (`sft_worker.py`); the two libraries
alternate (A/B, B/A, ...) for `--rounds` rounds and each figure is the median over rounds; ratios are replayrl / TRL
(tokens/s: > 1 is faster; RSS: < 1 is smaller). tokens/s counts real (non-padding) tokens of the measured steps.

What differs by design: replayrl keeps packed documents apart on sdpa with a block-diagonal mask over rows of
`max_length`; TRL 1.16 packs padding-free (one row per batch) and relies on FlashAttention to separate documents,
so on CPU/sdpa its packed documents attend to each other over the whole flattened batch.

    python benchmarks/sft_vs_trl.py [--quick] [--rounds 3] [--trl-python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BENCH_DIR, CONFIGS, MODEL_KEYS, median, print_table, ratio, remove_scratch, write_results  # noqa: E402
from vs_trl import TRL_VERSION, ensure_trl_venv, pinned_requirements  # noqa: E402


def prepare(work: Path, num_docs: int = 1024) -> tuple[Path, Path]:
    from replayrl.models.tiny import save_tiny

    model_dir = work / "model"
    save_tiny(model_dir, **{k: CONFIGS["larger"][k] for k in MODEL_KEYS})
    rng = random.Random(0)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 8))) for _ in range(500)]
    rows = []
    for _ in range(num_docs):
        target, text = rng.randint(16, 256), ""
        while len(text) < target:
            text += rng.choice(words) + " "
        rows.append({"text": text[:target]})
    data_file = work / "docs.jsonl"
    data_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model_dir, data_file


def run_worker(python: Path, args: list[str], log: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    cmd = [str(python), str(BENCH_DIR / "sft_worker.py"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"worker failed (rc={proc.returncode}), log {log}:\n" + proc.stderr[-3000:])


def summarize(result: dict) -> dict:
    return {
        "tokens_per_s": sum(result["tokens_per_step"]) / sum(result["steps"]),
        "step_s": median(result["steps"]),
        "peak_rss_mib": result["peak_rss_mib"],
        "prepare_s": result["prepare_s"],
    }


def compare(packing: bool, per_side: dict[str, list[dict]]) -> dict:
    row: dict = {"packing": packing}
    for impl in ("replayrl", "trl"):
        row[f"{impl}_tok_s"] = median(s["tokens_per_s"] for s in per_side[impl])
        row[f"{impl}_rss"] = median(s["peak_rss_mib"] for s in per_side[impl])
    row["tok_s_ratio"] = ratio(row["replayrl_tok_s"], row["trl_tok_s"])
    row["rss_ratio"] = ratio(row["replayrl_rss"], row["trl_rss"])
    return row


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 1 warm-up + 2 steps, 1 round")
    p.add_argument("--rounds", type=int, default=None, help="runs per side and setting, alternating (default 3)")
    p.add_argument("--trl-python", default=None, help="use this interpreter for TRL instead of .venv-trl")
    args = p.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    steps = ["--warmup", "1", "--steps", "2"] if args.quick else ["--warmup", "1", "--steps", "5"]
    steps += ["--max-length", "256", "--batch", "8"]
    sides = {"replayrl": Path(sys.executable), "trl": Path(args.trl_python) if args.trl_python else ensure_trl_venv()}
    work = Path(tempfile.mkdtemp(prefix="replayrl-sft-vs-trl-"))
    model_dir, data_file = prepare(work)
    rows, runs = [], []
    for packing in (False, True):
        per_side: dict[str, list[dict]] = {"replayrl": [], "trl": []}
        for r in range(rounds):
            for impl in ["replayrl", "trl"] if r % 2 == 0 else ["trl", "replayrl"]:
                worker = ["--impl", impl, "--model-dir", str(model_dir), "--data-file", str(data_file), *steps]
                worker += ["--seed", str(r)] + (["--packing"] if packing else [])
                result = run_worker(sides[impl], worker, work / f"{impl}-p{int(packing)}-r{r}.log")
                summary = summarize(result)
                per_side[impl].append(summary)
                runs.append({"packing": packing, "round": r, "impl": impl, "summary": summary, "result": result})
                print(
                    f"  packing={packing} round {r} {impl:8s} {summary['tokens_per_s']:.0f} tok/s, "
                    f"{summary['step_s']:.3f} s/step, peak RSS {summary['peak_rss_mib']:.0f} MiB",
                    flush=True,
                )
        rows.append(compare(packing, per_side))
    speedups = {impl: ratio(rows[1][f"{impl}_tok_s"], rows[0][f"{impl}_tok_s"]) for impl in ("replayrl", "trl")}
    columns = ["packing", "replayrl_tok_s", "trl_tok_s", "tok_s_ratio", "replayrl_rss", "trl_rss", "rss_ratio"]
    table = print_table(rows, columns, title="\nreplayrl vs TRL SFTTrainer (ratios replayrl / TRL)")
    gains = ", ".join(f"{k} {v:.2f}x" for k, v in speedups.items())
    print(f"packing speed-up (packed tok/s / unpacked tok/s): {gains}")
    payload = {"trl_version": TRL_VERSION, "requirements": pinned_requirements(), "rounds": rounds, "rows": rows}
    write_results("sft_vs_trl", {**payload, "packing_speedup": speedups, "table": table, "runs": runs}, args.quick)
    remove_scratch(work)


if __name__ == "__main__":
    main()
