"""Run under `accelerate launch --num_processes 2` by tests/distributed/test_strategies.py, under one strategy
(`tests.distributed.launch`): `python worker.py OUT NAME...` runs each named trainer's "2 processes == 1" worker
in turn (one process start and one DeepSpeed import for all) and saves {name: result} from the main process."""

import os
import sys

import torch

from replayrl.distributed import end_distributed
from tests.distributed.launch import setup_worker


def dpo(out: str) -> dict:
    from tests.dpo.distributed_worker import result, run

    return result(run(out, per_device_batch=4))


TR_DPO = dict(max_steps=2, precompute_ref_log_probs=False, sync_ref_model=True, ref_model_sync_steps=1,
              ref_model_mixup_alpha=0.5)  # fmt: skip


def dpo_sync_ref(out: str) -> dict:
    """TR-DPO: the reference (a partitioned engine under ZeRO-3) moves towards the policy after every step."""
    from tests.dpo.distributed_worker import result, run

    return result(run(out, per_device_batch=4, **TR_DPO))


def reward(out: str) -> dict:
    from tests.reward.distributed_worker import result, run

    return result(run(out, per_device_batch=4))


def grpo(out: str) -> dict:
    from tests.grpo.distributed_worker import grpo_step

    return grpo_step(out)


def grpo_no_gather(out: str) -> dict:
    """ZeRO-3 generation without gathering (synced_gpus, weights fetched layer by layer): same seed as `grpo`."""
    from tests.grpo.distributed_worker import grpo_step

    return grpo_step(out, ds3_gather_for_generation=False)


def grpo_peft(out: str) -> dict:
    """GRPO with a LoRA adapter (the reference: the policy with its adapter disabled)."""
    from peft import LoraConfig

    from tests.grpo.distributed_worker import grpo_step

    torch.manual_seed(0)  # LoRA's A matrices are drawn at wrapping: the same on both processes and in the check
    return grpo_step(out, peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))


def grpo_reward_model(out: str) -> dict:
    """GRPO scored by a reward model (a sequence classifier): under ZeRO-3 a partitioned inference engine."""
    from replayrl.models.tiny import build_tiny_sequence_classifier, build_tokenizer
    from tests.grpo.distributed_worker import grpo_step

    classifier = build_tiny_sequence_classifier(build_tokenizer(), seed=3, **REWARD_MODEL)
    return grpo_step(out, reward_model=classifier)


REWARD_MODEL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


def rloo(out: str) -> dict:
    from tests.rloo.distributed_worker import run

    return run(out)


def kto(out: str) -> dict:
    from tests.kto.distributed_worker import run

    return run(out)


def sft(out: str) -> dict:
    from tests.sft.distributed_worker import run

    return run(out, packing=True)


def distillation(out: str) -> dict:
    from tests.distillation.distributed_worker import run

    return run(out)


def ppo(out: str) -> dict:
    """PPOTrainer (its own Accelerator and loop): one step, 2 Adam steps, mini-batches of different lengths."""
    from tests.ppo.dist_step import run

    return run(out)


def ppo_accumulate(out: str) -> dict:
    """PPOTrainer accumulating 2 mini-batches per optimizer step (DeepSpeed: PPO's boundary, not accelerate's)."""
    from tests.ppo.dist_step import run

    return run(out, gradient_accumulation_steps=2, equal_lengths=True, sgd=True)


def ppo_resume(out: str) -> dict:
    from tests.ppo.dist_resume import run

    return run(out)


def ppo_lora(out: str) -> dict:  # by hand (not in CI, for time): see BY_HAND
    from tests.ppo.dist_step import run

    return run(out, lora=True)


def _resume(name: str):
    def worker(out: str) -> dict:
        from tests.distributed.resume import run

        return run(name, out)

    worker.__name__ = f"{name}_resume"
    return worker


TRAINERS = (dpo, dpo_sync_ref, reward, grpo, grpo_no_gather, grpo_peft, grpo_reward_model, rloo, kto, sft, distillation)
# Exact resume of every trainer (tests/distributed/test_resume.py, its own launch per strategy, marker
# `distributed_resume`: run by .ci/run after the main suite).
RESUME_TRAINERS = ("grpo", "grpo_replay", "rloo", "sft", "reward", "dpo", "kto", "distillation")
RESUMES = (*(_resume(name) for name in RESUME_TRAINERS), ppo_resume)
# Not launched by the tests (time). By hand: tests.distributed.launch.launch_strategy("zero3", WORKER, out, port,
# "ppo_lora"), then test_strategies.test_ppo's checks on the result.
BY_HAND = (ppo_lora,)
WORKERS = {f.__name__: f for f in (*TRAINERS, ppo, ppo_accumulate, *RESUMES, *BY_HAND)}


def main(out: str, names: list[str]) -> None:
    setup_worker()
    results = {name: WORKERS[name](os.path.join(out, name)) for name in names}
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(results, os.path.join(out, "result.pt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
    end_distributed()
