"""replayrl vs TRL 1.16 at real scale: a Qwen2-0.5B-shaped model in bf16 with the 151,936-token vocabulary.

    python benchmarks/scale.py [--trainers sft dpo reward grpo] [--rounds 2] [--trl-python PATH] [--quick]
                               [--profile [TRAINER ...]] [--logs DIR] [--output NAME]

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

Not in the default set: `sft_packed` (SFT with packing=True on both sides, `batch` rows of `max_length` tokens from
2,000 documents of 1/16 to all of `max_length` tokens) and `grpo_replay` (replayrl's GRPOWithReplayBufferTrainer, the
grpo settings plus a 64-group buffer; no TRL peer: its ratios are against replayrl's plain grpo run of the same
invocation, so run it after `grpo`), `grpo_static` (the grpo settings with `cache_implementation="static"` and prompts
padded to a multiple of 64 on both sides: on a GPU transformers compiles replayrl's decoding step, TRL's
GenerationConfig has `disable_compile=True`). `--profile [TRAINER ...]`: the workers of those trainers (all when
none is named) profile one more optimizer step after their timed ones (a GRPO worker also one standalone
generation with its library's own path); tables in
`results/scale_<device>_profiles/<trainer>-<impl>-<round>.txt`, a summary printed (`scale_profile.py`). Results are
written after every trainer, so a run cut short keeps the trainers it finished.
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
from common import BENCH_DIR, RESULTS_DIR, median, print_table, ratio, remove_scratch, write_results  # noqa: E402

TRL_PYTHON = str(BENCH_DIR / ".venv-trl" / "bin" / "python")  # made by vs_trl.py's ensure_trl_venv
VOCAB = 151_936
SHAPES = {
    "gpu": dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864),
    "cpu": dict(hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=1024),
}
# Per-trainer worker settings: (gpu, cpu).
RUNS = {
    "sft": ({"batch": 8, "max_length": 1024}, {"batch": 2, "max_length": 256}),
    "sft_packed": ({"batch": 8, "max_length": 1024}, {"batch": 2, "max_length": 256}),
    "dpo": ({"batch": 8, "max_length": 512}, {"batch": 2, "max_length": 128}),
    # A CPU reward step is ~0.2 s (no vocabulary-sized logits): more of them, so that the median is not noise.
    "reward": ({"batch": 8, "max_length": 512}, {"batch": 2, "max_length": 128, "warmup": 2, "steps": 10}),
    "grpo": (
        {"batch": 64, "num_generations": 8, "max_completion_length": 128},
        {"batch": 8, "num_generations": 4, "max_completion_length": 32},
    ),
}
RUNS["grpo_replay"] = RUNS["grpo_static"] = RUNS["grpo"]
DEFAULT_TRAINERS = ["sft", "dpo", "reward", "grpo"]
DATA = {"grpo_replay": "grpo", "grpo_static": "grpo"}  # trainers that read another trainer's data file
SIDES = {"grpo_replay": ["replayrl"]}  # no TRL peer: compared with replayrl's plain grpo run
PEER = {"grpo_replay": ("grpo", "replayrl")}  # (trainer, side) whose figures a peerless trainer's ratios divide by
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
    packed = [{"text": text(300, 300)[: rng.randint(sft_length // 16, sft_length - 1)]} for _ in range(2000)]
    files = {"sft": docs, "sft_packed": packed, "dpo": pairs, "reward": pairs}
    files["grpo"] = prompt_dataset(512, seed=0).to_list()
    paths = {}
    for name, rows in files.items():
        paths[name] = work / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model_dir, paths


def run_worker(python: str, args: list[str], log: Path, worker: str = "scale_worker.py") -> dict:
    """Run `worker` (a script beside this one) under `python`, one thread, offline, its output streamed into `log`
    (so a run cut short leaves its log); its `RESULT {json}` line."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    with log.open("w") as out:
        proc = subprocess.run([python, str(BENCH_DIR / worker), *args], stdout=out, stderr=subprocess.STDOUT, env=env)
    text = log.read_text()
    for line in text.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"worker failed (rc={proc.returncode}), log {log}:\n" + text[-3000:])


def side_figures(results: list[dict]) -> dict:
    """Medians over rounds of one side's runs."""
    return {
        "step_s": median(median(r["steps"]) for r in results),
        "cpu_s": median(median(r["cpu_steps"]) for r in results),
        "tok_s": median(sum(r["tokens_per_step"]) / sum(r["steps"]) for r in results),
        "mem_mib": median(r["working_set_mib"] for r in results),
        "floor_mib": median(r["optimizer_floor_mib"] for r in results),
    }


def summarize(trainer: str, per_side: dict[str, list[dict]], rows: list[dict]) -> dict:
    """The trainer's row: both sides' figures and replayrl / peer ratios; the peer is TRL, or for a trainer in
    `PEER` the figures of an earlier row (`rows`) of this invocation (ratios NaN if that trainer was not run)."""
    row: dict = {"trainer": trainer, "peer": "trl"}
    for impl, results in per_side.items():
        row.update({f"{impl}_{k}": v for k, v in side_figures(results).items()})
    peer = {k: row.get(f"trl_{k}") for k in ("step_s", "cpu_s", "mem_mib")}
    if trainer in PEER:
        name, side = PEER[trainer]
        row["peer"] = f"{side} {name}"
        done = next((r for r in rows if r["trainer"] == name), {})
        peer = {k: done.get(f"{side}_{k}", float("nan")) for k in peer}
    row["step_ratio"] = ratio(row["replayrl_step_s"], peer["step_s"])
    row["cpu_ratio"] = ratio(row["replayrl_cpu_s"], peer["cpu_s"])
    row["mem_ratio"] = ratio(row["replayrl_mem_mib"], peer["mem_mib"])
    row["floor_ratio"] = ratio(row["replayrl_floor_mib"], peer["mem_mib"])  # the least any faithful trainer holds
    return row


def profile_lines(profile: dict) -> list[str]:
    """A few lines per profiled part: wall, launches, syncs, top ops by self device and CPU time."""
    lines = []
    for part, p in profile.items():
        if "error" in p:
            lines.append(f"    profile {part} failed: {p['error']}")
            continue
        syncs = ", ".join(f"{k.split('::')[-1]} {v}" for k, v in p["syncs"].items() if v)
        head = f"    profile {part}: wall {p['wall_s']:.3f} s, {p['launches']} launches, {p['kernels']} kernels, "
        head += f"{p['d2h_copies']} D2H copies, syncs: {syncs or 'none'}"
        if p.get("per_decode_step"):
            head += f"; unprofiled {p['generate_runs_s']} s; per decode step ({p['decode_steps']}): "
            head += ", ".join(f"{k} {v}" for k, v in p["per_decode_step"].items() if v)
        lines.append(head)
        for key, name in (("top_device_ms", "device"), ("top_cpu_ms", "CPU")):
            if any(ms for _, ms, _ in p[key]):
                lines.append(f"      top self {name} ms: " + "; ".join(f"{n[:40]} {ms} ({c})" for n, ms, c in p[key]))
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trainers", nargs="+", default=DEFAULT_TRAINERS, choices=list(RUNS))
    p.add_argument("--rounds", type=int, default=2, help="runs per side and trainer, alternating")
    p.add_argument("--trl-python", default=TRL_PYTHON)
    p.add_argument("--quick", action="store_true", help="smoke run: 1 warm-up + 1 step, 1 round")
    p.add_argument("--profile", nargs="*", choices=list(RUNS), help="profile these trainers' runs (none named: all)")
    p.add_argument("--output", help="results name under benchmarks/results (default scale_<device>)")
    p.add_argument("--logs", type=Path, help="keep the worker logs in this folder (default: the scratch folder)")
    args = p.parse_args(argv)
    profiled = set(args.trainers if args.profile == [] else args.profile or [])
    import torch

    device = "gpu" if torch.cuda.is_available() else "cpu"
    name = args.output or f"scale_{device}"
    rounds = 1 if args.quick else args.rounds
    timing = TIMING["quick" if args.quick else device]
    work = Path(tempfile.mkdtemp(prefix="replayrl-scale-"))
    logs = args.logs or work
    profiles = RESULTS_DIR / f"{name}{'_quick' if args.quick else ''}_profiles"
    for folder in [logs, *([profiles] if profiled else [])]:
        folder.mkdir(parents=True, exist_ok=True)
    model_dir, data = make_assets(work, SHAPES[device], RUNS["sft"][device == "cpu"]["max_length"])
    python = {"replayrl": sys.executable, "trl": args.trl_python}
    rows, runs = [], []
    payload = {"device": device, "shape": SHAPES[device], "vocab_size": VOCAB, "rounds": rounds, "timing": timing}
    payload.update(settings={t: RUNS[t][device == "cpu"] for t in args.trainers}, rows=rows, runs=runs)
    columns = ["trainer", "peer", "replayrl_step_s", "trl_step_s", "step_ratio", "cpu_ratio", "replayrl_mem_mib"]
    columns += ["trl_mem_mib", "mem_ratio", "floor_ratio", "replayrl_tok_s", "trl_tok_s"]
    title = f"\nreplayrl vs TRL at the 152k vocabulary ({device}, {SHAPES[device]}; ratios replayrl / peer)"
    for trainer in args.trainers:
        own = RUNS[trainer][device == "cpu"]
        settings = {**own, **timing} if args.quick else {**timing, **own}
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
        sides = SIDES.get(trainer, ["replayrl", "trl"])
        per_side: dict[str, list[dict]] = {impl: [] for impl in sides}
        for r in range(rounds):
            for impl in sides if r % 2 == 0 else sides[::-1]:
                worker = ["--impl", impl, "--trainer", trainer, "--model-dir", str(model_dir)]
                worker += ["--data-file", str(data[DATA.get(trainer, trainer)]), *flags]
                if trainer in profiled:
                    worker += ["--profile", str(profiles / f"{trainer}-{impl}-{r}.txt")]
                result = run_worker(python[impl], worker, logs / f"{trainer}-{impl}-{r}.log")
                per_side[impl].append(result)
                runs.append(result)
                print(
                    f"  {trainer} round {r} {impl:8s} {median(result['steps']):.3f} s/step, "
                    f"working set {result['working_set_mib']:.0f} MiB, loss {result['loss']}"
                    + (f", {result['timing']}" if result.get("timing") else ""),
                    flush=True,
                )
                for line in profile_lines(result.get("profile", {})):
                    print(line, flush=True)
        rows.append(summarize(trainer, per_side, rows))
        payload["table"] = print_table(rows, columns, title=title)
        write_results(name, payload, args.quick)  # after every trainer: a run cut short keeps what it finished
    remove_scratch(work)


if __name__ == "__main__":
    main()
