"""Run under `accelerate launch --num_processes 2` by tests/grpo/test_async.py (CPU, gloo): GRPOTrainer with
async_generation; each rank's worker process samples that rank's share. Saves what each rank trained on and which
child processes were left after train()."""

import multiprocessing
import sys

import torch
from accelerate.utils import gather_object

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.distributed import end_distributed
from replayrl.models.tiny import build_tiny_model, build_tokenizer, prompt_dataset


def varied_reward(completions, **kwargs):
    return [float(sum(map(ord, c)) % 7) for c in completions]


def main(out: str) -> None:
    torch.set_num_threads(1)
    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_prompt_length=32,
        max_steps=3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        async_generation=True,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=varied_reward, args=args, train_dataset=prompt_dataset(16), processing_class=tok
    )
    trained = []
    original = trainer.compute_loss

    def compute_loss(model, inputs, *a, **k):
        trained.append((trainer.state.global_step, inputs.policy_version.tolist(), inputs.prompt_ids.tolist()))
        return original(model, inputs, *a, **k)

    trainer.compute_loss = compute_loss
    trainer.train()
    result = gather_object([{"trained": trained, "children": len(multiprocessing.active_children())}])
    params = [p.detach().clone() for p in trainer.model.parameters()]
    if trainer.accelerator.is_main_process:
        torch.save({"ranks": result, "params": params, "mismatches": trainer._async.mismatches}, f"{out}/result.pt")
    end_distributed()


if __name__ == "__main__":
    main(sys.argv[1])
