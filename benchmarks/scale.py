"""replayrl vs TRL 1.16 at real scale: a Qwen2-0.5B-shaped model in bf16 with the 151,936-token vocabulary.

    python benchmarks/scale.py [--trainers sft dpo reward grpo] [--rounds 2] [--trl-python PATH] [--quick]

For each of SFT, DPO (sigmoid, reference model), reward and GRPO (beta 0, transformers generate): median seconds per
optimizer step (and CPU seconds of the process per step: on a shared machine the steadier figure), tokens/s, and the
memory `train()` uses above what the process held when it was called (on a GPU `torch.cuda.max_memory_allocated()`;
on a CPU the peak RSS during `train()` minus the RSS at its start, see `scale_worker.py`). A fresh process per run,
sides alternating (replayrl, TRL, TRL, replayrl, ...), the same saved model, data and settings on both sides; a
figure is the median over rounds, a ratio is replayrl / TRL (< 1: replayrl faster / smaller).

Model: Qwen2-0.5B's shape (hidden 896, 24 layers, 14/2 heads, intermediate 4864, tied embeddings) on a GPU; on a
CPU a reduced body (hidden 256, 2 layers, 4/2 heads, intermediate 1024) with the full 151,936-token vocabulary, so
the vocabulary-sized tensors dominate as they do at full scale. Seeded random weights saved in bf16; the tokenizer
is the ~100-token character tokenizer of `replayrl.models.tiny` (the other ids exist only in the softmax).
Per step: SFT `batch` rows of `max_length` tokens (no padding: every document is that long), DPO/reward `batch`
pairs, GRPO `batch` completions (`num_generations` per prompt) of `max_completion_length` tokens (random weights
almost never sample EOS, so tokens/step is counted as batch x max_completion_length).
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
from common import BENCH_DIR, median, print_table, ratio, remove_scratch, write_results  # noqa: E402

TRL_PYTHON = str(BENCH_DIR / ".venv-trl" / "bin" / "python")  # made by vs_trl.py's ensure_trl_venv
VOCAB = 151_936
SHAPES = {
    "gpu": dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864),
    "cpu": dict(hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=1024),
}
# Per-trainer worker settings: (gpu, cpu).
RUNS = {
    "sft": ({"batch": 8, "max_length": 1024}, {"batch": 2, "max_length": 256}),
    "dpo": ({"batch": 8, "max_length": 512}, {"batch": 2, "max_length": 128}),
    # A CPU reward step is ~0.2 s (no vocabulary-sized logits): more of them, so that the median is not noise.
    "reward": ({"batch": 8, "max_length": 512}, {"batch": 2, "max_length": 128, "warmup": 2, "steps": 10}),
    "grpo": (
        {"batch": 64, "num_generations": 8, "max_completion_length": 128},
        {"batch": 8, "num_generations": 4, "max_completion_length": 32},
    ),
}
TIMING = {"gpu": dict(warmup=2, steps=5), "cpu": dict(warmup=1, steps=3), "quick": dict(warmup=1, steps=1)}


def make_assets(work: Path, shape: dict, sft_length: int) -> tuple[Path, dict[str, Path]]:
    """The causal LM (and `<dir>-rm`, the same body as a 1-label sequence classifier) in bf16, and a data file per
    trainer."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from replayrl.models.tiny import build_tiny_model, build_tokenizer, prompt_dataset

    tok = build_tokenizer()
    model_dir = work / "model"
    model = build_tiny_model(tok, seed=0, **shape)
    model.resize_token_embeddings(VOCAB, mean_resizing=False)
    model.to(torch.bfloat16).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rm = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.bfloat16)
    rm.config.pad_token_id = tok.pad_token_id
    rm.save_pretrained(f"{model_dir}-rm")
    tok.save_pretrained(f"{model_dir}-rm")
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "sum", "of", "the", "is", "what", "answer"]
    text = lambda lo, hi: " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))  # noqa: E731
    pair = lambda: {"prompt": text(8, 14) + "?", "chosen": " " + text(4, 9), "rejected": " " + text(4, 9)}  # noqa: E731
    pairs = [pair() for _ in range(256)]
    docs = [{"text": (text(200, 200) * 2)[: sft_length - 1]} for _ in range(256)]  # + EOS = exactly max_length
    files = {"sft": docs, "dpo": pairs, "reward": pairs, "grpo": prompt_dataset(512, seed=0).to_list()}
    paths = {}
    for name, rows in files.items():
        paths[name] = work / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model_dir, paths


def run_worker(python: str, args: list[str], log: Path, worker: str = "scale_worker.py") -> dict:
    """Run `worker` (a script beside this one) under `python`, one thread, offline; its `RESULT {json}` line."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([python, str(BENCH_DIR / worker), *args], capture_output=True, text=True, env=env)
    log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"worker failed (rc={proc.returncode}), log {log}:\n" + proc.stderr[-3000:])


def summarize(trainer: str, per_side: dict[str, list[dict]]) -> dict:
    row: dict = {"trainer": trainer}
    for impl, results in per_side.items():
        row[f"{impl}_step_s"] = median(median(r["steps"]) for r in results)
        row[f"{impl}_cpu_s"] = median(median(r["cpu_steps"]) for r in results)
        row[f"{impl}_tok_s"] = median(sum(r["tokens_per_step"]) / sum(r["steps"]) for r in results)
        row[f"{impl}_mem_mib"] = median(r["working_set_mib"] for r in results)
        row[f"{impl}_floor_mib"] = median(r["optimizer_floor_mib"] for r in results)
    row["step_ratio"] = ratio(row["replayrl_step_s"], row["trl_step_s"])
    row["cpu_ratio"] = ratio(row["replayrl_cpu_s"], row["trl_cpu_s"])
    row["mem_ratio"] = ratio(row["replayrl_mem_mib"], row["trl_mem_mib"])
    row["floor_ratio"] = ratio(row["replayrl_floor_mib"], row["trl_mem_mib"])  # the least any faithful trainer holds
    return row


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trainers", nargs="+", default=list(RUNS), choices=list(RUNS))
    p.add_argument("--rounds", type=int, default=2, help="runs per side and trainer, alternating")
    p.add_argument("--trl-python", default=TRL_PYTHON)
    p.add_argument("--quick", action="store_true", help="smoke run: 1 warm-up + 1 step, 1 round")
    args = p.parse_args(argv)
    import torch

    device = "gpu" if torch.cuda.is_available() else "cpu"
    rounds = 1 if args.quick else args.rounds
    timing = TIMING["quick" if args.quick else device]
    work = Path(tempfile.mkdtemp(prefix="replayrl-scale-"))
    model_dir, data = make_assets(work, SHAPES[device], RUNS["sft"][device == "cpu"]["max_length"])
    sides = {"replayrl": sys.executable, "trl": args.trl_python}
    rows, runs = [], []
    for trainer in args.trainers:
        own = RUNS[trainer][device == "cpu"]
        settings = {**own, **timing} if args.quick else {**timing, **own}
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
        per_side: dict[str, list[dict]] = {"replayrl": [], "trl": []}
        for r in range(rounds):
            for impl in ["replayrl", "trl"] if r % 2 == 0 else ["trl", "replayrl"]:
                worker = ["--impl", impl, "--trainer", trainer, "--model-dir", str(model_dir)]
                worker += ["--data-file", str(data[trainer]), *flags]
                result = run_worker(sides[impl], worker, work / f"{trainer}-{impl}-{r}.log")
                per_side[impl].append(result)
                runs.append(result)
                print(
                    f"  {trainer} round {r} {impl:8s} {median(result['steps']):.3f} s/step, "
                    f"working set {result['working_set_mib']:.0f} MiB, loss {result['loss']}"
                    + (f", {result['timing']}" if result.get("timing") else ""),
                    flush=True,
                )
        rows.append(summarize(trainer, per_side))
    columns = ["trainer", "replayrl_step_s", "trl_step_s", "step_ratio", "cpu_ratio", "replayrl_mem_mib", "trl_mem_mib"]
    columns += ["mem_ratio", "floor_ratio", "replayrl_tok_s", "trl_tok_s"]
    title = f"\nreplayrl vs TRL at the 152k vocabulary ({device}, {SHAPES[device]}; ratios replayrl / TRL)"
    table = print_table(rows, columns, title=title)
    payload = {"device": device, "shape": SHAPES[device], "vocab_size": VOCAB, "rounds": rounds, "timing": timing}
    payload.update(settings={t: RUNS[t][device == "cpu"] for t in args.trainers}, rows=rows, table=table, runs=runs)
    write_results(f"scale_{device}", payload, args.quick)
    remove_scratch(work)


if __name__ == "__main__":
    main()
