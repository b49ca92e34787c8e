"""One timed SFT run of replayrl's or TRL's `SFTTrainer`, in its own process (run by `sft_vs_trl.py`).

Prints `RESULT {json}`: per-step wall times (between two `on_step_end` callbacks: everything the Trainer does),
the real (non-padding) tokens of every step's batch, counted from the rows handed to the collator so that both
libraries are counted the same way, and the process's peak RSS. Imports only the standard library at module level:
it also runs inside the TRL virtualenv, where replayrl is not installed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from common import peak_rss_mib  # noqa: E402

SETTINGS = dict(  # spelled out for both libraries (TRL defaults to bf16 and gradient checkpointing)
    learning_rate=1e-5,
    lr_scheduler_type="constant",
    max_grad_norm=1.0,
    bf16=False,
    gradient_checkpointing=False,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    disable_tqdm=True,
    dataloader_num_workers=0,
    dataloader_pin_memory=False,
    use_cpu=True,
)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=["replayrl", "trl"], required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--data-file", required=True)
    p.add_argument("--packing", action="store_true")
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def load(impl: str):
    if impl == "trl":
        from trl import SFTConfig, SFTTrainer
    else:
        sys.path.insert(0, str(BENCH_DIR.parent))
        from replayrl import SFTConfig, SFTTrainer
    return SFTConfig, SFTTrainer


def main() -> None:
    args = parse()
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    torch.set_num_threads(1)
    SFTConfig, SFTTrainer = load(args.impl)
    data = load_dataset("json", data_files=args.data_file, split="train")
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    config = SFTConfig(
        output_dir=tempfile.mkdtemp(prefix="sft-bench-"),
        max_steps=args.warmup + args.steps,
        per_device_train_batch_size=args.batch,
        packing=args.packing,
        max_length=args.max_length,
        seed=args.seed,
        **SETTINGS,
    )
    start = time.perf_counter()
    trainer = SFTTrainer(model, args=config, train_dataset=data, processing_class=tokenizer)
    prepare_s = time.perf_counter() - start
    tokens: list[int] = []
    inner = trainer.data_collator

    def counting_collator(features):
        tokens.append(sum(len(f["input_ids"]) for f in features))
        return inner(features)

    trainer.data_collator = counting_collator
    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            ends.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            ends.append(time.perf_counter())

    trainer.add_callback(Clock())
    trainer.train()
    durations = [b - a for a, b in zip(ends, ends[1:])]
    result = {
        "impl": args.impl,
        "packing": args.packing,
        "prepare_s": prepare_s,
        "steps": durations[args.warmup :],
        "tokens_per_step": tokens[args.warmup : args.warmup + args.steps],
        "rows_per_epoch": len(trainer.train_dataset),
        "peak_rss_mib": peak_rss_mib(),
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
