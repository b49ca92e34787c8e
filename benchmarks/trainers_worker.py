"""One timed run of replayrl's or TRL's RLOO, KTO or distillation trainer (run by `trainers_vs_trl.py`).

    python benchmarks/trainers_worker.py --impl replayrl --trainer rloo --model-dir DIR --data-file FILE [...]

Prints `RESULT {json}`: wall and CPU seconds of every optimizer step (between two `on_step_end` callbacks, so
everything the Trainer does: generation, the reference/teacher passes, the loss, the optimizer), the memory
`train()` used above what the process held when it was called (`scale_worker.Memory`: peak RSS during `train()`
minus the RSS at its start on a CPU, the CUDA allocator's peak on a GPU; every weight paged in before, see
`scale_worker.page_in`) and the logged metrics of the first and last step (to check that both sides did the same
work). Imports only the standard library at module level: it also runs inside the TRL virtualenv.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from common import make_random_reward  # noqa: E402
from scale_worker import COMMON, library, measured_train  # noqa: E402

# Every setting that either library's defaults could change, spelled out for both (on top of scale_worker.COMMON:
# constant lr, max_grad_norm 1, no gradient checkpointing, seed 0, logging every step, no saving).
SHARED = dict(learning_rate=1e-6, gradient_accumulation_steps=1, disable_dropout=True)
SAMPLING = dict(temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0, generation_kwargs=None)
RLOO = dict(SAMPLING, beta=0.05, num_iterations=1, epsilon=0.2, epsilon_high=0.2, normalize_advantages=False,
            reward_clip_range=None, mask_truncated_completions=False, steps_per_generation=1, shuffle_dataset=True,
            reward_weights=None)  # fmt: skip
KTO = dict(beta=0.1, loss_type="kto", desirable_weight=1.0, undesirable_weight=1.0, precompute_ref_log_probs=False,
           train_sampling_strategy="sequential", sync_ref_model=False)  # fmt: skip
DISTILLATION = dict(SAMPLING, beta=1.0, shuffle_dataset=True, teacher_model_init_kwargs={"dtype": "float32"})
SETTINGS = {"rloo": RLOO, "kto": KTO, "distillation": DISTILLATION}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=["replayrl", "trl"], required=True)
    p.add_argument("--trainer", choices=list(SETTINGS), required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--teacher-dir", default=None, help="distillation: the teacher (same vocabulary)")
    p.add_argument("--data-file", required=True)
    p.add_argument("--batch", type=int, default=8, help="per_device_train_batch_size (completions for RLOO)")
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--max-completion-length", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128, help="KTO: prompt + completion tokens")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    return p.parse_args()


def build(args, lib, cuda: bool):
    from datasets import load_dataset

    data = load_dataset("json", data_files=args.data_file, split="train")
    common = dict(COMMON, **SHARED, **SETTINGS[args.trainer], output_dir=tempfile.mkdtemp(prefix="trainers-"))
    common.update(max_steps=args.warmup + args.steps, per_device_train_batch_size=args.batch)
    common.update(bf16=cuda, use_cpu=not cuda, model_init_kwargs={"dtype": "bfloat16" if cuda else "float32"})
    if args.trainer == "rloo":
        generation = dict(num_generations=args.num_generations, max_completion_length=args.max_completion_length)
        config = lib.RLOOConfig(**common, **generation)
        return lib.RLOOTrainer(args.model_dir, reward_funcs=[make_random_reward(0)], args=config, train_dataset=data)
    if args.trainer == "kto":
        config = lib.KTOConfig(**common, max_length=args.max_length)
        return lib.KTOTrainer(args.model_dir, args=config, train_dataset=data)
    if cuda:
        common["teacher_model_init_kwargs"] = {"dtype": "bfloat16"}
    config = lib.DistillationConfig(**common, max_completion_length=args.max_completion_length)
    return lib.DistillationTrainer(args.model_dir, teacher_model=args.teacher_dir, args=config, train_dataset=data)


def main() -> None:
    args = parse()
    import torch
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(1)
    trainer = build(args, library(args.impl), cuda)
    ends: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            ends.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            ends.append((time.perf_counter(), time.process_time()))

    trainer.add_callback(Clock())
    mem = measured_train(trainer, cuda)
    pairs = list(zip(ends, ends[1:]))[args.warmup :]
    logs = [r for r in trainer.state.log_history if "loss" in r]
    result = {"impl": args.impl, "trainer": args.trainer, "first_log": logs[0], "last_log": logs[-1]}
    result.update(steps=[b[0] - a[0] for a, b in pairs], cpu_steps=[b[1] - a[1] for a, b in pairs])
    result.update(mem)
    print("RESULT " + json.dumps(result), flush=True)
    shutil.rmtree(trainer.args.output_dir, ignore_errors=True)  # metrics.jsonl of the run


if __name__ == "__main__":
    main()
