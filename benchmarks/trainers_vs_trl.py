"""replayrl's RLOO, KTO and distillation trainers against TRL 1.16's: seconds per optimizer step and the memory
`train()` uses, the same saved model, data and settings on both sides.

    python benchmarks/trainers_vs_trl.py --trainer rloo|kto|distillation [--vocab 32768 151936] [--rounds 3]
        [--trl-python PATH] [--quick]

A fresh process per run (`trainers_worker.py`), sides alternating (replayrl, TRL, TRL, replayrl, ...); a side's
figure is the median over rounds of its per-run median step (the warm-up step dropped), in wall seconds and in
the process's CPU seconds (fairer on a shared machine: wall time includes waiting for a core); memory is the peak
RSS during `train()` above the RSS at its start on a CPU (CUDA allocator peak on a GPU). Ratio = replayrl / TRL
(< 1: replayrl faster / smaller).

Model (both sides load the same files): a Qwen2 body of 2 layers, hidden 256, 4/2 heads, intermediate 1024, tied
embeddings, with a real-sized vocabulary (`--vocab`, each size a row): the vocabulary-sized tensors (lm_head,
log-softmax, the teacher's distribution) dominate as at full scale. Seeded random weights in float32, the ~100-token
character tokenizer of `replayrl.models.tiny` (the other ids exist only in the softmax). Settings, spelled out on
both sides in `trainers_worker.py` (TRL's defaults would otherwise turn on bf16 and gradient checkpointing):
  rloo: 8 completions per step (2 prompts x G=4), 32 new tokens (random weights almost never sample EOS), beta
        0.05 (a reference model), temperature 1, no top-k/top-p, one iteration, TRL's random reward stream;
  kto: 8 rows (4 desirable, 4 undesirable, sequential order), max_length 128, beta 0.1, loss 'kto' (the KL
       reference point from mismatched pairs on both sides), reference model;
  distillation: 8 prompts, 32 new tokens sampled by the student, beta 1 (reverse KL), temperature 1, a teacher
                of the same shape (another seed).
All: fp32, lr 1e-6 constant, gradient accumulation 1, no evaluation, no checkpoints, one torch thread.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCH_DIR, median, print_table, ratio, remove_scratch, write_results  # noqa: E402
from scale import run_worker  # noqa: E402

SHAPE = dict(hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=1024)
VOCABS = (32_768, 151_936)
RUN = dict(batch=8, num_generations=4, max_completion_length=32, max_length=128)
TIMING = {"full": dict(warmup=1, steps=3), "quick": dict(warmup=1, steps=1)}


def save_model(path: Path, vocab: int, seed: int) -> Path:
    import torch

    from replayrl.models.tiny import build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=seed, **SHAPE)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.resize_token_embeddings(vocab, mean_resizing=False)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def make_data(work: Path, trainer: str) -> Path:
    """KTO: 256 unpaired rows, labels alternating; RLOO / distillation: 512 prompts."""
    from replayrl.models.tiny import prompt_dataset

    if trainer == "kto":
        rng = random.Random(0)
        words = ["alpha", "beta", "gamma", "delta", "sum", "of", "the", "is", "what", "answer"]
        text = lambda lo, hi: " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))  # noqa: E731
        rows = [{"prompt": text(8, 14) + "?", "completion": " " + text(4, 9), "label": i % 2 == 0} for i in range(256)]
    else:
        rows = prompt_dataset(512, seed=0).to_list()
    path = work / f"{trainer}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def summarize(vocab: int, per_side: dict[str, list[dict]]) -> dict:
    row: dict = {"vocab": vocab}
    for impl, results in per_side.items():
        row[f"{impl}_step_s"] = median(median(r["steps"]) for r in results)
        row[f"{impl}_cpu_s"] = median(median(r["cpu_steps"]) for r in results)
        row[f"{impl}_mem_mib"] = median(r["working_set_mib"] for r in results)
        row[f"{impl}_loss"] = median(r["first_log"]["loss"] for r in results)
    row["step_ratio"] = ratio(row["replayrl_step_s"], row["trl_step_s"])
    row["cpu_ratio"] = ratio(row["replayrl_cpu_s"], row["trl_cpu_s"])
    row["mem_ratio"] = ratio(row["replayrl_mem_mib"], row["trl_mem_mib"])
    return row


def measure(opts, work: Path, vocab: int, timing: dict, runs: list[dict]) -> dict:
    model = save_model(work / f"model-{vocab}", vocab, seed=0)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in {**RUN, **timing}.items()]
    flags += ["--trainer", opts.trainer, "--model-dir", str(model), "--data-file", str(make_data(work, opts.trainer))]
    if opts.trainer == "distillation":
        flags += ["--teacher-dir", str(save_model(work / f"teacher-{vocab}", vocab, seed=1))]
    sides = {"replayrl": sys.executable, "trl": opts.trl_python}
    per_side: dict[str, list[dict]] = {"replayrl": [], "trl": []}
    for r in range(opts.rounds):
        for impl in ["replayrl", "trl"] if r % 2 == 0 else ["trl", "replayrl"]:
            log = work / f"{vocab}-{impl}-{r}.log"
            result = run_worker(sides[impl], ["--impl", impl, *flags], log, worker="trainers_worker.py")
            result.update(vocab=vocab, round=r)
            per_side[impl].append(result)
            runs.append(result)
            print(
                f"  {opts.trainer} V={vocab} round {r} {impl:8s} {median(result['steps']):.3f} s/step "
                f"({median(result['cpu_steps']):.3f} CPU s), train() +{result['working_set_mib']:.0f} MiB, "
                f"first loss {result['first_log']['loss']:.4g}",
                flush=True,
            )
    return summarize(vocab, per_side)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trainer", required=True, choices=["rloo", "kto", "distillation"])
    p.add_argument("--vocab", type=int, nargs="+", default=list(VOCABS), help="vocabulary sizes, a row each")
    p.add_argument("--rounds", type=int, default=3, help="runs per side and vocabulary, alternating")
    p.add_argument("--trl-python", default=str(BENCH_DIR / ".venv-trl" / "bin" / "python"))
    p.add_argument("--quick", action="store_true", help="smoke run: 1 warm-up + 1 timed step, 1 round")
    opts = p.parse_args(argv)
    if opts.quick:
        opts.rounds = 1
    timing = TIMING["quick" if opts.quick else "full"]
    work = Path(tempfile.mkdtemp(prefix=f"replayrl-{opts.trainer}-vs-trl-"))
    runs: list[dict] = []
    rows = [measure(opts, work, vocab, timing, runs) for vocab in opts.vocab]
    columns = ["vocab", "replayrl_step_s", "trl_step_s", "step_ratio", "replayrl_cpu_s", "trl_cpu_s", "cpu_ratio"]
    columns += ["replayrl_mem_mib", "trl_mem_mib", "mem_ratio", "replayrl_loss", "trl_loss"]
    title = f"\n{opts.trainer}: replayrl vs TRL 1.16 (median s/step, train() memory MiB; ratios replayrl / TRL)"
    table = print_table(rows, columns, title=title)
    payload = {"trainer": opts.trainer, "shape": SHAPE, "run": RUN, "rounds": opts.rounds, "timing": timing}
    payload.update(rows=rows, table=table, runs=runs)
    write_results(f"{opts.trainer}_vs_trl", payload, opts.quick)
    remove_scratch(work)


if __name__ == "__main__":
    main()
