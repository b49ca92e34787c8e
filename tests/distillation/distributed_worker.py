"""Run under `accelerate launch --num_processes 2` by tests/distillation/test_distributed.py (CPU, gloo): one SGD
step of DistillationTrainer with 4 prompts per process; saves what each process trained on and the parameters."""

import os
import sys

import torch
from accelerate.utils import gather_object

from replayrl import DistillationConfig, DistillationTrainer
from replayrl.distributed import end_distributed
from replayrl.models.tiny import build_tiny_model, build_tokenizer, prompt_dataset
from tests.distributed.launch import full_params, run_settings, setup_worker, sharding_report

SIZE = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


def run(out: str) -> dict:
    """Every process: trains, returns the gathered batches, whole parameters, loss."""
    tok = build_tokenizer()
    student, teacher = build_tiny_model(tok, seed=0, **SIZE), build_tiny_model(tok, seed=1, **SIZE)
    args = DistillationConfig(output_dir=out, per_device_train_batch_size=4, max_steps=1, optim="sgd",
                              learning_rate=1.0, max_grad_norm=0.0, beta=0.5, max_completion_length=6, bf16=False,
                              gradient_checkpointing=False, logging_steps=1, save_strategy="no", report_to="none",
                              **run_settings(), seed=0, disable_tqdm=True)  # fmt: skip
    seen = []
    trainer = DistillationTrainer(student, teacher, args=args, train_dataset=prompt_dataset(16), processing_class=tok)
    original = trainer.compute_loss
    trainer.compute_loss = lambda model, inputs, *a, **kw: seen.append(inputs) or original(model, inputs, *a, **kw)
    trainer.train()
    batches = gather_object([{k: v.cpu() for k, v in seen[0].items()}])
    result = {"batches": batches, "params": full_params(trainer.accelerator.unwrap_model(trainer.model))}
    result.update(loss=trainer.state.log_history[0]["loss"], world=trainer.accelerator.num_processes)
    result.update(sharding=sharding_report(trainer.model), teacher_sharding=sharding_report(trainer.teacher_model))
    return result


if __name__ == "__main__":
    setup_worker()
    summary = run(sys.argv[1])
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(summary, os.path.join(sys.argv[1], "result.pt"))
    end_distributed()
