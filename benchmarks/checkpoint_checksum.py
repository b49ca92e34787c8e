"""What checking a checkpoint's files costs: checksum time over save time, at Qwen2-0.5B's shape.

A Qwen2-0.5B-shaped model (hidden 896, 24 layers, 14/2 heads, intermediate 4864, vocabulary 151,936, tied
embeddings; random fp32 weights) is saved as `Trainer` saves it: `save_pretrained` (safetensors) and
`torch.save` of an AdamW state dict (exp_avg and exp_avg_sq per parameter: the same bytes as AdamW's after a
step, built directly so that the benchmark needs no gradients). Then each checksum algorithm reads every file of
the checkpoint. Rounds alternate save and checksums; the table gives medians and the ratio to the save.

    OMP_NUM_THREADS=1 python benchmarks/checkpoint_checksum.py --rounds 2 [--dir /tmp/ckpt] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ALGORITHMS = ("xxh3_128", "xxh3_64", "crc32", "blake2b", "sha256")


def build(dtype: str):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=32_768,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    params = list(model.parameters())
    state = {
        i: {"step": torch.tensor(1.0), "exp_avg": torch.randn_like(p), "exp_avg_sq": torch.rand_like(p)}
        for i, p in enumerate(params)
    }
    groups = [{"lr": 1e-6, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "params": list(range(len(params)))}]
    return model, {"state": state, "param_groups": groups}


def save(model, optimizer_state, directory: Path) -> float:
    import torch

    start = time.perf_counter()
    model.save_pretrained(directory, safe_serialization=True)
    torch.save(optimizer_state, directory / "optimizer.pt")
    torch.save({"last_epoch": 1}, directory / "scheduler.pt")
    torch.save({"python": None, "cpu": torch.get_rng_state()}, directory / "rng_state.pth")
    return time.perf_counter() - start


def checksum_seconds(directory: Path, algorithm: str) -> float:
    from replayrl.checksums import checkpoint_files, file_checksum

    start = time.perf_counter()
    for name in checkpoint_files(directory):
        if algorithm == "crc32":
            import zlib

            crc = 0
            with open(directory / name, "rb") as f:
                while chunk := f.read(8 << 20):
                    crc = zlib.crc32(chunk, crc)
        else:
            file_checksum(directory / name, algorithm)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--dir", default=None, help="where to save (default: a temporary folder)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model, optimizer_state = build(args.dtype)
    parent = Path(args.dir or tempfile.mkdtemp(prefix="ckpt-bench-"))
    times: dict[str, list[float]] = {"save": [], **{a: [] for a in ALGORITHMS}}
    size = 0
    for _ in range(args.rounds):
        directory = parent / "checkpoint-1"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        times["save"].append(save(model, optimizer_state, directory))
        size = sum(p.stat().st_size for p in directory.iterdir())
        for algorithm in ALGORITHMS:
            times[algorithm].append(checksum_seconds(directory, algorithm))
    shutil.rmtree(parent / "checkpoint-1", ignore_errors=True)
    save_median = statistics.median(times["save"])
    print(f"checkpoint: {size / 1e9:.2f} GB ({args.dtype} weights + AdamW state), {args.rounds} rounds")
    print(f"{'':10} {'median s':>9} {'GB/s':>6} {'/ save':>7}   all rounds")
    rows = {}
    for name, values in times.items():
        median = statistics.median(values)
        rows[name] = {"seconds": values, "median": median, "ratio_to_save": median / save_median}
        print(f"{name:10} {median:9.2f} {size / 1e9 / median:6.2f} {median / save_median:7.3f}   {values}")
    if args.out:
        Path(args.out).write_text(json.dumps({"bytes": size, "dtype": args.dtype, "times": rows}, indent=1))


if __name__ == "__main__":
    main()
