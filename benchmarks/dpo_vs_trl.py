"""replayrl's DPOTrainer against TRL's: seconds per optimizer step, setup seconds and peak RSS, same everything.

    python benchmarks/dpo_vs_trl.py [--rounds 3] [--steps 12] [--trl_python PATH] [--trainer dpo|reward]

`--trainer reward` (what `reward_vs_trl.py` runs) compares the RewardTrainers instead: the same pairs, the same
model saved as a sequence classifier (num_labels=1, pad_token_id set), lr 1e-4, one row (no reference model).

TRL runs in its own virtualenv (`benchmarks/.venv-trl`, made by `vs_trl.py`'s `ensure_trl_venv`, or any python
given with --trl_python) with this environment's torch/transformers/accelerate/datasets, so only the trainer
differs. Both sides load the same saved tiny Qwen2 (hidden 256, 4 layers, character tokenizer) and the same 256
preference pairs (prompts 20-60 characters, completions 5-40), batch 8, max_length 256, one torch thread, fp32
and no gradient checkpointing on both sides (TRL 1.16's defaults are bf16=True, gradient_checkpointing=True);
with and without precomputed reference log-probs. Sides alternate (replayrl, TRL, TRL, replayrl, ...), one
fresh process per run; a side's figure is the median over rounds of its per-run median step time (the first 2
steps skipped), in wall seconds and in the process's CPU seconds (fairer on a shared machine, where wall time
includes waiting for a core). Ratio = replayrl / TRL (< 1: replayrl faster / smaller).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCH_DIR, REPO_DIR, median, print_table, ratio, write_results  # noqa: E402

WORKER = Path(__file__).with_name("dpo_worker.py")


def make_assets(work: Path, trainer: str = "dpo") -> tuple[str, str]:
    from replayrl.models.tiny import build_tiny_sequence_classifier, build_tokenizer, save_tiny

    size = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2)
    if trainer == "reward":
        model_dir, tok = str(work / "rm"), build_tokenizer()
        build_tiny_sequence_classifier(tok, **size).save_pretrained(model_dir)  # config has pad_token_id
        tok.save_pretrained(model_dir)
    else:
        model_dir = save_tiny(work / "model", **size)
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "sum", "of", "the", "is", "what", "answer"]
    text = lambda lo, hi: " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))  # noqa: E731
    rows = [{"prompt": text(4, 10) + "?", "chosen": " " + text(1, 7), "rejected": " " + text(1, 7)} for _ in range(256)]
    data = work / "prefs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model_dir, str(data)


def run(
    python: str, side: str, model_dir: str, data: str, out: Path, precompute: int, steps: int, trainer: str
) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_DIR)}
    cmd = [python, str(WORKER), side, model_dir, data, str(out), str(precompute), str(steps), trainer]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{side} worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--trl_python", default=str(BENCH_DIR / ".venv-trl" / "bin" / "python"))
    parser.add_argument("--trainer", choices=["dpo", "reward"], default="dpo")
    opts = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir, data = make_assets(work, opts.trainer)
        pythons = {"replayrl": sys.executable, "trl": opts.trl_python}
        for precompute in (0, 1) if opts.trainer == "dpo" else (0,):
            runs: dict[str, list[dict]] = {"replayrl": [], "trl": []}
            for r in range(opts.rounds):
                order = ["replayrl", "trl"] if r % 2 == 0 else ["trl", "replayrl"]
                for side in order:
                    out = work / f"{side}-{precompute}-{r}.json"
                    runs[side].append(
                        run(pythons[side], side, model_dir, data, out, precompute, opts.steps, opts.trainer)
                    )
            row = {"precompute_ref_log_probs": bool(precompute)} if opts.trainer == "dpo" else {}
            for side, results in runs.items():
                row[f"{side}_step_s"] = median(median(x["step_seconds"][2:]) for x in results)
                row[f"{side}_step_cpu_s"] = median(median(x["step_cpu_seconds"][2:]) for x in results)
                row[f"{side}_setup_s"] = median(x["setup_seconds"] for x in results)
                row[f"{side}_peak_mib"] = median(x["peak_rss_mib"] for x in results)
                row[f"{side}_first_loss"] = results[0]["first_loss"]
            row["step_ratio"] = ratio(row["replayrl_step_s"], row["trl_step_s"])
            row["cpu_ratio"] = ratio(row["replayrl_step_cpu_s"], row["trl_step_cpu_s"])
            row["peak_ratio"] = ratio(row["replayrl_peak_mib"], row["trl_peak_mib"])
            rows.append(row)
    columns = ["precompute_ref_log_probs"] if opts.trainer == "dpo" else []
    columns += ["replayrl_step_s", "trl_step_s", "step_ratio", "replayrl_step_cpu_s"]
    columns += ["trl_step_cpu_s", "cpu_ratio", "replayrl_peak_mib"]
    columns += ["trl_peak_mib", "peak_ratio", "replayrl_setup_s", "trl_setup_s"]
    columns += ["replayrl_first_loss", "trl_first_loss"]
    name = {"dpo": "DPO", "reward": "RewardTrainer"}[opts.trainer]
    table = print_table(rows, columns, f"{name}: replayrl vs TRL (median seconds per optimizer step, peak RSS MiB)")
    write_results(f"{opts.trainer}_vs_trl", {"rows": rows, "table": table, "rounds": opts.rounds, "steps": opts.steps})


if __name__ == "__main__":
    main()
