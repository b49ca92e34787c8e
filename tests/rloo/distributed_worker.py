"""Run under `accelerate launch --num_processes 2` by tests/rloo/test_distributed.py (CPU, gloo): one SGD step
of RLOOTrainer with the KL in the reward and normalised advantages; saves the global batch trained on and the
parameters after the step."""

import os
import sys

import torch
from accelerate.utils import gather_object

from replayrl import RLOOConfig, RLOOTrainer
from replayrl.distributed import end_distributed
from replayrl.models.tiny import build_tiny_model, build_tokenizer, prompt_dataset
from tests.distributed.launch import full_params, run_settings, setup_worker, sharding_report


def varied_reward(completions, **kwargs):
    return [float(sum(map(ord, c)) % 7) for c in completions]


def run(out: str) -> dict:
    """Every process: trains, returns the gathered batches, whole parameters, loss."""
    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = RLOOConfig(output_dir=out, per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
                      max_steps=1, optim="sgd", learning_rate=1.0, max_grad_norm=0.0, beta=0.1,
                      normalize_advantages=True, bf16=False, gradient_checkpointing=False, logging_steps=1,
                      save_strategy="no", report_to="none", **run_settings(), seed=0, disable_tqdm=True)  # fmt: skip
    trainer = RLOOTrainer(model=model, reward_funcs=varied_reward, args=args, train_dataset=prompt_dataset(16),
                          processing_class=tok)  # fmt: skip
    trainer.train()
    batches = gather_object([[mb.to("cpu").state_dict() for mb in trainer._micro_batches]])
    result = {"batches": batches, "params": full_params(trainer.accelerator.unwrap_model(trainer.model))}
    result.update(loss=trainer.state.log_history[0]["loss"], world=trainer.accelerator.num_processes)
    return {**result, "sharding": sharding_report(trainer.model)}


if __name__ == "__main__":
    setup_worker()
    summary = run(sys.argv[1])
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(summary, os.path.join(sys.argv[1], "result.pt"))
    end_distributed()
