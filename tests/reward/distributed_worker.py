"""Run under `accelerate launch --num_processes 2` by tests/reward/test_distributed.py (CPU, gloo): one SGD step
of RewardTrainer on prefix-shared rows (`python WORKER OUT_DIR`, or as one process); saves the logged loss and
the parameters after the step."""

import sys

import torch

from replayrl import RewardConfig, RewardTrainer
from replayrl.distributed import end_distributed
from replayrl.models.tiny import build_tiny_sequence_classifier, build_tokenizer
from replayrl.tasks.preferences import preference_datasets
from tests.distributed.launch import full_params, run_settings, setup_worker, sharding_report

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


def run(out: str, per_device_batch: int) -> RewardTrainer:
    torch.set_num_threads(1)
    tok = build_tokenizer()
    data = preference_datasets(seed=0, per_problem=1, rejected="near_miss")[0].select(range(8))
    args = RewardConfig(
        output_dir=out,
        per_device_train_batch_size=per_device_batch,
        max_steps=1,
        optim="sgd",
        learning_rate=1.0,
        max_grad_norm=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        **run_settings(),
        seed=0,
        disable_tqdm=True,
    )
    model = build_tiny_sequence_classifier(tok, seed=0, **SMALL)
    trainer = RewardTrainer(model, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    return trainer


def result(trainer: RewardTrainer) -> dict:
    return {
        "world": trainer.accelerator.num_processes,
        "loss": trainer.state.log_history[0]["loss"],
        "params": full_params(trainer.accelerator.unwrap_model(trainer.model)),
        "sharding": sharding_report(trainer.model),
    }


if __name__ == "__main__":
    setup_worker()
    trainer = run(sys.argv[1], per_device_batch=4)
    summary = result(trainer)  # every process: gathering sharded parameters is collective
    if trainer.accelerator.is_main_process:
        torch.save(summary, f"{sys.argv[1]}/result.pt")
    end_distributed()
