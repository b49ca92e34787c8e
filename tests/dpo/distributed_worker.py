"""Run under `accelerate launch --num_processes 2` by tests/dpo/test_distributed.py (CPU, gloo): one SGD step
of DPOTrainer (`python WORKER OUT_DIR`, or as one process) with reference log-probs precomputed from a separate
reference model; saves the logged loss, the precomputed columns and the parameters after the step."""

import sys

import torch

from replayrl import DPOConfig, DPOTrainer
from replayrl.distributed import end_distributed
from replayrl.models.tiny import build_tiny_model, build_tokenizer
from replayrl.tasks.preferences import preference_datasets
from tests.distributed.launch import full_params, run_settings, setup_worker, sharding_report

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


def run(out: str, per_device_batch: int, **overrides) -> DPOTrainer:
    torch.set_num_threads(1)
    tok = build_tokenizer()
    data = preference_datasets(seed=0, per_problem=1, rejected="near_miss")[0].select(range(8))
    settings = dict(
        output_dir=out,
        per_device_train_batch_size=per_device_batch,
        per_device_eval_batch_size=3,  # 8 rows over 2 processes in batches of 3: the gather has padding to drop
        max_steps=1,
        optim="sgd",
        learning_rate=1.0,
        max_grad_norm=0.0,
        precompute_ref_log_probs=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        **run_settings(),
        seed=0,
        disable_tqdm=True,
    )
    args = DPOConfig(**{**settings, **overrides})
    trainer = DPOTrainer(
        build_tiny_model(tok, seed=0, **SMALL),
        ref_model=build_tiny_model(tok, seed=1, **SMALL),
        args=args,
        train_dataset=data,
        processing_class=tok,
    )
    trainer.train()
    return trainer


def result(trainer: DPOTrainer) -> dict:
    return {
        "world": trainer.accelerator.num_processes,
        "loss": trainer.state.log_history[0]["loss"],
        "ref_chosen_logps": trainer.train_dataset["ref_chosen_logps"] if trainer.args.precompute_ref_log_probs else 0,
        "params": full_params(trainer.accelerator.unwrap_model(trainer.model)),
        "sharding": sharding_report(trainer.model),
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        # the reference, where it is kept (precomputed log-probs free it)
        **(
            {}
            if trainer.ref_model is None
            else {
                "ref_params": full_params(trainer.accelerator.unwrap_model(trainer.ref_model)),
                "ref_sharding": sharding_report(trainer.ref_model),
            }
        ),
    }


if __name__ == "__main__":
    setup_worker()
    trainer = run(sys.argv[1], per_device_batch=4)
    summary = result(trainer)  # every process: gathering sharded parameters is collective
    if trainer.accelerator.is_main_process:
        torch.save(summary, f"{sys.argv[1]}/result.pt")
    end_distributed()
