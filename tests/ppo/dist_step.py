"""Helper for test_distributed.py: one PPO step on a fixed batch of 8 samples, split over the processes.

Run as `python dist_step.py OUT` (1 process) or
`ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 dist_step.py OUT`; process 0 writes the
updated parameters and the step's losses to OUT.
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

from replayrl.distributed import end_distributed
from replayrl.models.tiny import build_tiny_model, build_tokenizer
from replayrl.models.value_head import AutoModelForCausalLMWithValueHead
from replayrl.ppo import PPOConfig, PPOTrainer

N = 8


def accelerator_kwargs() -> dict:
    """DeepSpeed on CPU: accelerate forms the process group only with an explicit gloo backend."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false") != "true":
        return {}
    from accelerate.utils import InitProcessGroupKwargs

    return {"kwargs_handlers": [InitProcessGroupKwargs(backend="gloo")]}


def main(out: str) -> None:
    from accelerate.state import AcceleratorState

    # accelerate's state is per process: run in the test process, an earlier Trainer's bf16=True would otherwise make
    # PPOTrainer's Accelerator() train under bf16 autocast (the two-process run starts fresh)
    AcceleratorState._reset_state()
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    lm = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    torch.manual_seed(0)
    model = AutoModelForCausalLMWithValueHead.from_pretrained(lm)
    g = torch.Generator().manual_seed(0)
    # different lengths on purpose: the processes hold different numbers of tokens
    queries = [torch.randint(5, 90, (2 + i % 3,), generator=g) for i in range(N)]
    responses = [torch.randint(5, 90, (1 + (3 * i) % 5,), generator=g) for i in range(N)]
    scores = torch.rand(N, generator=g).tolist()
    settings = dict(ppo_epochs=2, learning_rate=1e-2, init_kl_coef=0.1, accelerator_kwargs=accelerator_kwargs())
    config = PPOConfig(batch_size=N, mini_batch_size=N, **settings)
    probe = PPOTrainer(config, model, None, tokenizer)  # only to learn the process layout
    world, rank = probe.accelerator.num_processes, probe.accelerator.process_index
    print(f"rank {rank} of {world}", file=sys.stderr)
    per = N // world
    config = PPOConfig(batch_size=per, mini_batch_size=per, **settings)
    trainer = PPOTrainer(config, model, None, tokenizer)
    rows = slice(rank * per, (rank + 1) * per)
    stats = trainer.step(queries[rows], responses[rows], scores[rows])
    if trainer.accelerator.is_main_process:
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        save_file({k: v.clone().contiguous() for k, v in unwrapped.state_dict().items()}, f"{out}/params.safetensors")
        # the losses (token means over the whole batch); not per-process stats such as ppo/val/error
        keys = ["ppo/loss/total", "ppo/loss/policy", "ppo/loss/value", "objective/kl", "objective/kl_coef"]
        with open(f"{out}/stats.json", "w") as f:
            json.dump({k: stats[k] for k in keys}, f)
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    from tests.distributed.launch import setup_worker

    setup_worker()  # under FSDP2: accelerate's FSDP path let through on CPU
    main(sys.argv[1])
    end_distributed()
