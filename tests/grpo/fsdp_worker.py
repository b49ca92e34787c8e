"""Run under `accelerate launch` by tests/grpo/test_fsdp.py (CPU, gloo, 2 processes) and by the GPU check in
docs/distributed.md (1 process).

fsdp2:  a tiny GRPOTrainer.train() for 2 steps under examples/accelerate/fsdp2.yaml; reports how accelerate
        actually ran it (distributed type, FSDP2 or not, DTensor parameters) and what it logged.
fsdp2-forced, resume-forced: the same with accelerate's FSDP path let through on CPU (`force_fsdp_on_cpu`), so
        the parameters really are sharded (DTensors) over the two processes.
resume: GRPOWithReplayBufferTrainer (4 steps) stops after its checkpoint at step 2, then a second trainer
        resumes it with resume_from_checkpoint=True and trains to step 4; a third trains 4 steps without
        stopping. Reports each rank's buffer before and after, and the logs of both 4-step runs.
"""

import json
import os
import sys

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback

from replayrl import GRPOConfig, GRPOTrainer, GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from replayrl.distributed import end_distributed
from replayrl.models.sharding import zero_stage
from replayrl.models.tiny import build_tiny_model, build_tokenizer, prompt_dataset
from tests.distributed.launch import run_settings, sharding_report


def force_fsdp_on_cpu() -> None:
    """accelerate 1.15 ignores FSDP settings on CPU (it picks FSDP only for accelerator device types, see
    docs/distributed.md). Let the FSDP plugin through on MULTI_CPU, also when accelerate re-initializes its state
    later (its optimizer wrapper does), so that accelerate's own FSDP2 code runs: `fully_shard` per decoder layer
    over gloo, full state dicts for checkpoints. Nothing else of accelerate or replayrl changes."""
    from accelerate import state
    from accelerate.utils import DistributedType

    original = state.AcceleratorState.__init__
    plugin = []

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None:
            plugin[:] = [fsdp_plugin]
        if plugin and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = plugin[0]

    state.AcceleratorState.__init__ = init


def varied_reward(completions, **kwargs):
    return [float(sum(map(ord, c)) % 7) for c in completions]


def common(out, **overrides):
    on_gpu = torch.cuda.is_available()
    kwargs = dict(
        output_dir=out,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_prompt_length=32,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        **({} if on_gpu else run_settings()),  # CPU: use_cpu, or gloo without it under DeepSpeed
        seed=0,
        disable_tqdm=True,
    )
    return {**kwargs, **overrides}


class StopAfter(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


def buffer_of(trainer) -> list:
    return [(g.uid, round(g.score, 6), g.version) for g in trainer.replay_buffer.groups]


def run_fsdp2(out: str) -> dict:
    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1)
    args = GRPOConfig(**common(out, max_steps=2, beta=0.0))
    trainer = GRPOTrainer(
        model=model, reward_funcs=varied_reward, args=args, train_dataset=prompt_dataset(16), processing_class=tok
    )
    trainer.train()
    from torch.distributed.tensor import DTensor

    acc = trainer.accelerator
    return {
        "rank": acc.process_index,
        "world": acc.num_processes,
        "distributed_type": str(acc.distributed_type),
        "is_fsdp2": bool(getattr(acc, "is_fsdp2", False)),
        "dtensor_params": sum(isinstance(p, DTensor) for p in trainer.model.parameters()),
        "params": sum(1 for _ in trainer.model.parameters()),
        "device": str(acc.device),
        "global_step": trainer.state.global_step,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
    }


def run_resume(out: str) -> dict:
    tok = build_tokenizer()

    def trainer_for(max_steps, output_dir=out):
        model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
        settings = dict(max_steps=max_steps, save_strategy="steps", save_steps=2, replay_buffer_size=8, beta=0.0)
        args = GRPOWithReplayBufferConfig(**common(output_dir, **settings))
        return GRPOWithReplayBufferTrainer(
            model=model, reward_funcs=varied_reward, args=args, train_dataset=prompt_dataset(32), processing_class=tok
        )

    first = trainer_for(4)
    first.add_callback(StopAfter(2))  # interrupted after checkpoint-2 (same schedule as the 4-step runs)
    first.train()
    saved = buffer_of(first)
    second = trainer_for(4)
    loaded = {}
    original = second._load_extra_state

    def spy(state):
        original(state)
        loaded["buffer"] = buffer_of(second)

    second._load_extra_state = spy
    second.train(resume_from_checkpoint=True)
    straight = trainer_for(4, os.path.join(out, "straight"))  # the same run without the interruption
    straight.train()
    return {
        "rank": second.accelerator.process_index,
        "is_fsdp2": bool(getattr(second.accelerator, "is_fsdp2", False)),
        "distributed_type": str(second.accelerator.distributed_type),
        "zero_stage": zero_stage(second.accelerator),
        "sharding": sharding_report(second.model),
        "saved": saved,
        "loaded": loaded.get("buffer"),
        "global_step": second.state.global_step,
        "resumed_logs": [h for h in second.state.log_history if "loss" in h],
        "straight_logs": [h for h in straight.state.log_history if "loss" in h],
        "final_buffer": buffer_of(second),
        "straight_buffer": buffer_of(straight),
    }


def main(mode: str, out: str) -> None:
    torch.set_num_threads(1)
    if mode.endswith("-forced"):
        force_fsdp_on_cpu()
    summary = run_resume(out) if mode.startswith("resume") else run_fsdp2(out)
    everything = gather_object([summary]) if torch.distributed.is_initialized() else [summary]
    if int(os.environ.get("RANK", "0")) == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(everything, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    end_distributed()
