"""Run under `accelerate launch --num_processes 2` by tests/kto/test_distributed.py (CPU, gloo): two SGD steps of
KTOTrainer with 4 rows per process; saves the parameters and the logs."""

import os
import sys

import torch

from replayrl import KTOConfig, KTOTrainer
from replayrl.distributed import end_distributed
from replayrl.models.tiny import build_tiny_model, build_tokenizer
from replayrl.tasks.preferences import preference_datasets
from tests.distributed.launch import full_params, run_settings, setup_worker, sharding_report


def run(out: str) -> dict:
    """Every process: trains, returns the whole parameters and the logs."""
    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = KTOConfig(output_dir=out, per_device_train_batch_size=4, max_steps=2, optim="sgd", learning_rate=1.0,
                     max_grad_norm=0.0, bf16=False, gradient_checkpointing=False, logging_steps=1,
                     save_strategy="no", report_to="none", **run_settings(), seed=0, disable_tqdm=True)  # fmt: skip
    trainer = KTOTrainer(model, args=args, train_dataset=preference_datasets(0, 1)[0], processing_class=tok)
    trainer.train()
    result = {"params": full_params(trainer.accelerator.unwrap_model(trainer.model))}
    result.update(logs=trainer.state.log_history, world=trainer.accelerator.num_processes)
    return {**result, "sharding": sharding_report(trainer.model)}


if __name__ == "__main__":
    setup_worker()
    summary = run(sys.argv[1])
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(summary, os.path.join(sys.argv[1], "result.pt"))
    end_distributed()
