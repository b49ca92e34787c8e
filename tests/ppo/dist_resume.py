"""Helper for tests/distributed: `PPOTrainer.train()` under the launched strategy, 4 steps writing checkpoint-2 on
the way, and a new trainer (another output_dir) resumed from that checkpoint to step 4. Returns what the test
compares (from every process)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.ppo.dist_step import accelerator_kwargs


def trainer_for(out: Path, steps: int, **overrides):
    from accelerate.state import AcceleratorState
    from datasets import Dataset

    from replayrl.models.tiny import build_tiny_model, build_tokenizer
    from replayrl.models.value_head import AutoModelForCausalLMWithValueHead
    from replayrl.ppo import PPOConfig, PPOTrainer

    AcceleratorState._reset_state()  # a fresh Accelerator per trainer, as in a new launch
    tokenizer = build_tokenizer()
    lm = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    torch.manual_seed(0)  # the value head's init
    model = AutoModelForCausalLMWithValueHead.from_pretrained(lm)
    dataset = Dataset.from_dict({"prompt": [f"q{i}:" for i in range(16)]})
    kwargs = dict(steps=4 * steps, batch_size=4, mini_batch_size=2, learning_rate=1e-2, init_kl_coef=0.05)
    kwargs.update(
        output_dir=str(out), adap_kl_ctrl=True, use_score_scaling=True, accelerator_kwargs=accelerator_kwargs()
    )
    return PPOTrainer(PPOConfig(**kwargs, **overrides), model, None, tokenizer, dataset=dataset)


def letters(completions, **kwargs) -> list[float]:
    return [sum(c.isalpha() for c in text) / max(len(text), 1) for text in completions]


def run(out: str) -> dict:
    from accelerate.state import AcceleratorState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    from replayrl.metrics import read_metrics
    from tests.distributed.launch import full_params, sharding_report

    unset_hf_deepspeed_config()  # an earlier ZeRO-3 Trainer of the worker would build the tiny model partitioned
    out, gen = Path(out), {"generation_kwargs": {"max_new_tokens": 4}}
    full = trainer_for(out / "full", steps=4, save_steps=2)  # checkpoint-2 on its way
    initial = full_params(full.accelerator.unwrap_model(full.model))
    full.train([letters], **gen)
    resumed = trainer_for(out / "resumed", steps=4)
    resumed.train([letters], resume_from_checkpoint=str(out / "full" / "checkpoint-2"), **gen)
    result = {
        "full": full_params(full.accelerator.unwrap_model(full.model)),
        "resumed": full_params(resumed.accelerator.unwrap_model(resumed.model)),
        "kl": (full.kl_ctl.value, resumed.kl_ctl.value),
        "metrics": (read_metrics(out / "full" / "metrics.jsonl"), read_metrics(out / "resumed" / "metrics.jsonl")),
        "checkpoint": sorted(str(p.relative_to(out)) for p in (out / "full" / "checkpoint-2").rglob("*")),
        "initial": initial,
        "sharding": sharding_report(resumed.model),
        "optimizer_files": [optimizer_file(out / "full" / "checkpoint-2", rank) for rank in range(2)],
    }
    AcceleratorState._reset_state()
    return result


def optimizer_file(checkpoint: Path, rank: int) -> dict | None:
    """What rank ``rank``'s state file holds of the optimizer (None under DeepSpeed: the engine's own files):
    how many of its tensors were FSDP2 shards, and its moments' elements (vs the parameters' whole elements)."""
    from replayrl.checkpoints import load_extra_state

    optimizer = load_extra_state(checkpoint, f"ppo_state_rank{rank}")["optimizer"]
    if optimizer is None:
        return None
    moments = [v for entry in optimizer["state"].values() for k, v in entry.items() if k != "step"]
    return {"dtensors": len(optimizer.get("dtensors", [])), "elements": sum(v.numel() for v in moments)}
