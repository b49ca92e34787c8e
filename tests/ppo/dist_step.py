"""Helper for test_distributed.py and tests/distributed: one PPO step on a fixed batch of 8 samples, split over the
processes.

Run as `python dist_step.py OUT` (1 process) or
`ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 dist_step.py OUT`; process 0 writes the
updated parameters and the step's losses to OUT. `run` is the same step returning them (tests/distributed/worker.py
calls it under DeepSpeed ZeRO-2/3 and FSDP2).
"""

import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

from replayrl.distributed import end_distributed
from replayrl.models.tiny import build_tiny_model, build_tokenizer
from replayrl.models.value_head import AutoModelForCausalLMWithValueHead
from replayrl.ppo import PPOConfig, PPOTrainer
from replayrl.ppo.checkpoint import save_model

N = 8
# the losses (token means over the whole batch); not per-process stats such as ppo/val/error
STAT_KEYS = ["ppo/loss/total", "ppo/loss/policy", "ppo/loss/value", "objective/kl", "objective/kl_coef"]


def accelerator_kwargs() -> dict:
    """DeepSpeed on CPU: accelerate forms the process group only with an explicit gloo backend."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false") != "true":
        return {}
    from accelerate.utils import InitProcessGroupKwargs

    return {"kwargs_handlers": [InitProcessGroupKwargs(backend="gloo")]}


def samples(equal_lengths: bool) -> tuple[list, list, list]:
    """8 (query, response, score) triples; by default of different lengths on purpose (the processes then hold
    different numbers of tokens); ``equal_lengths``: every micro-batch holds the same number of tokens, so
    accumulating over micro-batches gives the update of the whole batch at once."""
    g = torch.Generator().manual_seed(0)
    q_len = (lambda i: 3) if equal_lengths else (lambda i: 2 + i % 3)
    r_len = (lambda i: 4) if equal_lengths else (lambda i: 1 + (3 * i) % 5)
    queries = [torch.randint(5, 90, (q_len(i),), generator=g) for i in range(N)]
    responses = [torch.randint(5, 90, (r_len(i),), generator=g) for i in range(N)]
    return queries, responses, torch.rand(N, generator=g).tolist()


def run(out: str, gradient_accumulation_steps: int = 1, equal_lengths: bool = False, sgd: bool = False,
        lora: bool = False) -> dict:  # fmt: skip
    """One `PPOTrainer.step` (2 PPO epochs: 2 optimizer steps; Adam, or with ``sgd`` SGD at lr 1, whose update is
    linear in the gradient: Adam turns the rounding noise of a near-zero gradient, which a different summation
    order changes, into lr-sized moves) on this process's share of the 8 samples, in mini-batches of
    ``share / gradient_accumulation_steps`` rows; with ``lora`` a LoRA adapter on the policy (the reference: the
    adapter disabled). Returns the whole parameters (gathered), the
    losses, how the policy and the reference are held, DeepSpeed's optimizer step count, and completions sampled
    with ``ds3_gather_for_generation`` True and False."""
    from accelerate.state import AcceleratorState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    from tests.distributed.launch import full_params, sharding_report

    # accelerate's state is per process: run in the test process, an earlier Trainer's bf16=True would otherwise make
    # PPOTrainer's Accelerator() train under bf16 autocast; after an earlier ZeRO-3 Trainer, transformers would build
    # the tiny model already partitioned (a user builds it before any engine exists)
    AcceleratorState._reset_state()
    unset_hf_deepspeed_config()
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    lm = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    torch.manual_seed(0)
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    model = AutoModelForCausalLMWithValueHead.from_pretrained(lm, peft_config=peft_config)
    queries, responses, scores = samples(equal_lengths)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    print(f"rank {rank} of {world}", file=sys.stderr)
    per = N // world
    settings = dict(ppo_epochs=2, learning_rate=1e-2, init_kl_coef=0.1, accelerator_kwargs=accelerator_kwargs())
    mini = per // gradient_accumulation_steps
    config = PPOConfig(batch_size=per, mini_batch_size=mini, gradient_accumulation_steps=gradient_accumulation_steps,
                       **settings)  # fmt: skip
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0) if sgd else None
    trainer = PPOTrainer(config, model, None, tokenizer, optimizer=optimizer)
    assert trainer.accelerator.num_processes == world
    rows = slice(rank * per, (rank + 1) * per)
    stats = trainer.step(queries[rows], responses[rows], scores[rows])
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    names = [name for name, _ in unwrapped.named_parameters()]
    save_model(trainer, f"{out}/saved")  # every process: sharded weights are gathered for the file
    trainer.accelerator.wait_for_everyone()
    result = {
        "params": dict(zip(names, full_params(unwrapped))),
        "stats": {k: stats[k] for k in STAT_KEYS},
        "sharding": sharding_report(unwrapped),
        "ref_sharding": None if trainer.ref_model is None else sharding_report(trainer.ref_model),
        "optimizer_steps": getattr(trainer.model, "global_steps", None),  # a DeepSpeed engine's count
        "completions": sample_both_ways(trainer, queries[rows][:2]),
        "saved": load_file(f"{out}/saved/model.safetensors") if rank == 0 and not lora else None,
    }
    trainer.accelerator.wait_for_everyone()
    return result


def sample_both_ways(trainer, queries: list) -> dict[bool, list]:
    """`generate` with the same seed, the policy's weights gathered for the call and (ZeRO-3) left partitioned."""
    completions = {}
    for gather in (True, False):
        trainer.config.ds3_gather_for_generation = gather
        torch.manual_seed(1 + trainer.accelerator.process_index)  # each process's own, reproducible samples
        kwargs = dict(max_new_tokens=4, do_sample=True, top_k=0, top_p=1.0)
        completions[gather] = [r.cpu() for r in trainer.generate(queries, return_prompt=False, **kwargs)]
    trainer.config.ds3_gather_for_generation = True
    return completions


def main(out: str) -> None:
    result = run(out)
    if int(os.environ.get("RANK", "0")) == 0:
        save_file({k: v.contiguous() for k, v in result["params"].items()}, f"{out}/params.safetensors")
        with open(f"{out}/stats.json", "w") as f:
            json.dump(result["stats"], f)


if __name__ == "__main__":
    from tests.distributed.launch import setup_worker

    setup_worker()  # under FSDP2: accelerate's FSDP path let through on CPU
    main(sys.argv[1])
    end_distributed()
