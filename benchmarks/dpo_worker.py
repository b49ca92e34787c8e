"""One DPO or reward-model run for benchmarks/dpo_vs_trl.py and reward_vs_trl.py, in whichever environment runs
it (replayrl's or TRL's venv).

    python dpo_worker.py {replayrl|trl} MODEL_DIR DATA_JSONL OUT_JSON PRECOMPUTE(0|1) STEPS [dpo|reward]

`reward` trains a RewardTrainer on the same pairs (MODEL_DIR then holds a sequence classifier, PRECOMPUTE is
ignored); the replayrl side appends EOS as TRL does, so both train on the same tokens.

Same model files, data, batch and settings on both sides; writes per-step wall and CPU seconds (optimizer steps,
timed from step end to step end), peak RSS and the first logged loss.
"""

import json
import sys
import time

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback


class StepTimer(TrainerCallback):
    """Wall seconds and this process's CPU seconds per optimizer step. On a shared machine the CPU seconds are the
    fairer figure: wall time also counts the time the process waited for a core."""

    def __init__(self):
        self.times, self.cpu_times, self.last = [], [], None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.last is None:
            self.last = (time.perf_counter(), time.process_time())

    def on_step_end(self, args, state, control, **kwargs):
        now = (time.perf_counter(), time.process_time())
        self.times.append(now[0] - self.last[0])
        self.cpu_times.append(now[1] - self.last[1])
        self.last = now


def peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def make_trainer(trainer_name, side, model_dir, out, precompute, steps):
    """(TrainerClass, model, args) for one side; settings identical on both sides except where noted."""
    lib = __import__("trl" if side == "trl" else "replayrl")
    common = dict(
        output_dir=f"{out}.run", per_device_train_batch_size=8, max_steps=steps, max_length=256, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0,
        # Pinned on both sides: TRL 1.16 defaults to bf16=True and gradient_checkpointing=True, replayrl to False
        # (TrainingArguments' defaults); bf16 matmuls on this CPU were ~20x slower than fp32.
        bf16=False, gradient_checkpointing=False,
    )  # fmt: skip
    if trainer_name == "reward":
        extra = {} if side == "trl" else {"append_eos": True}  # TRL always appends EOS to text pairs
        args = lib.RewardConfig(learning_rate=1e-4, **common, **extra)
        return lib.RewardTrainer, AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1), args
    args = lib.DPOConfig(learning_rate=1e-6, beta=0.1, precompute_ref_log_probs=bool(precompute), **common)
    return lib.DPOTrainer, AutoModelForCausalLM.from_pretrained(model_dir), args


def main(side, model_dir, data, out, precompute, steps, trainer_name="dpo"):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer_cls, model, args = make_trainer(trainer_name, side, model_dir, out, precompute, steps)
    timer = StepTimer()
    start = time.perf_counter()
    trainer = trainer_cls(model, args=args, train_dataset=load_dataset("json", data_files=data, split="train"),
                         processing_class=tok, callbacks=[timer])  # fmt: skip
    setup = time.perf_counter() - start
    trainer.train()
    loss = next(r["loss"] for r in trainer.state.log_history if "loss" in r)
    result = {"step_seconds": timer.times, "step_cpu_seconds": timer.cpu_times, "setup_seconds": setup}
    result.update(peak_rss_mib=peak_rss_mib(), first_loss=loss)
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:5], int(sys.argv[5]), int(sys.argv[6]), *sys.argv[7:8])
