"""Run under `accelerate launch --num_processes 2` by tests/sft/test_distributed.py (CPU, gloo): one SGD step of
SFTTrainer on a 4-row global batch (2 rows per process); saves the logged loss and the parameters after it."""

import os
import sys

import torch

from replayrl import SFTConfig, SFTTrainer
from replayrl.distributed import end_distributed
from replayrl.models.tiny import build_tiny_model, build_tokenizer
from tests.distributed.launch import full_params, run_settings, setup_worker, sharding_report
from tests.sft.helpers import varied_dataset


def run(out: str, packing: bool) -> dict:
    """Every process: trains, returns the loss, the log and the whole parameters."""
    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = SFTConfig(
        output_dir=out,
        per_device_train_batch_size=1 if packing else 2,
        max_steps=1,
        optim="sgd",
        learning_rate=0.5,
        max_grad_norm=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        **run_settings(),
        seed=0,
        disable_tqdm=True,
        packing=packing,
        max_length=24,
    )
    trainer = SFTTrainer(model, args=args, train_dataset=varied_dataset(), processing_class=tok)
    trainer.train()
    log = next(h for h in trainer.state.log_history if "loss" in h)
    params = full_params(trainer.accelerator.unwrap_model(trainer.model))
    result = {"world": trainer.accelerator.num_processes, "loss": log["loss"], "params": params, "log": log}
    return {**result, "sharding": sharding_report(trainer.model)}


if __name__ == "__main__":
    setup_worker()
    summary = run(sys.argv[1], sys.argv[2] == "packed")
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(summary, f"{sys.argv[1]}/result.pt")
    end_distributed()
