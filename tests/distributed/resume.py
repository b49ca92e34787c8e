"""Exact resume under the launched strategy for the transformers-Trainer trainers (tests/distributed/worker.py):
a 4-step run that writes checkpoint-2 on its way, and a new trainer resumed from that checkpoint to step 4 (what a
run stopped after checkpoint-2 resumes from, without training its first 2 steps twice). AdamW (its moments are in
the checkpoint: DeepSpeed's own partitions under ZeRO), a learning rate that moves the weights, every trainer's own
data and settings from its "2 processes == 1" worker (GRPO: the settings of tests/grpo/fsdp_worker.py's resume)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.distributed.launch import full_params, run_settings, sharding_report

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


def common(output_dir: str, max_steps: int, **overrides) -> dict:
    kwargs = dict(output_dir=output_dir, max_steps=max_steps, save_strategy="steps", save_steps=2, learning_rate=1e-2,
                  logging_steps=1, report_to="none", seed=0, disable_tqdm=True, **run_settings())  # fmt: skip
    return {**kwargs, **overrides}


def sft(output_dir: str, max_steps: int):
    from replayrl import SFTConfig, SFTTrainer
    from replayrl.models.tiny import build_tiny_model, build_tokenizer
    from tests.sft.helpers import varied_dataset

    tok = build_tokenizer()
    args = SFTConfig(**common(output_dir, max_steps, per_device_train_batch_size=1, max_length=24))
    return SFTTrainer(build_tiny_model(tok, **SMALL), args=args, train_dataset=varied_dataset(), processing_class=tok)


def dpo(output_dir: str, max_steps: int):
    """DPO with a separate reference model read during training (under ZeRO-3 a partitioned inference engine)."""
    from replayrl import DPOConfig, DPOTrainer
    from replayrl.models.tiny import build_tiny_model, build_tokenizer
    from replayrl.tasks.preferences import preference_datasets

    tok = build_tokenizer()
    data = preference_datasets(seed=0, per_problem=1, rejected="near_miss")[0].select(range(8))
    args = DPOConfig(**common(output_dir, max_steps, per_device_train_batch_size=2, precompute_ref_log_probs=False))
    ref = build_tiny_model(tok, seed=1, **SMALL)
    return DPOTrainer(build_tiny_model(tok, seed=0, **SMALL), ref_model=ref, args=args, train_dataset=data,
                      processing_class=tok)  # fmt: skip


def rloo(output_dir: str, max_steps: int):
    """RLOO: sampling (the RNG streams are in the checkpoint), a KL term against the partitioned reference."""
    from replayrl import RLOOConfig, RLOOTrainer
    from replayrl.models.tiny import build_tiny_model, build_tokenizer, prompt_dataset
    from tests.rloo.distributed_worker import varied_reward

    tok = build_tokenizer()
    settings = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=6, beta=0.1, bf16=False)
    args = RLOOConfig(**common(output_dir, max_steps, **settings, gradient_checkpointing=False))
    return RLOOTrainer(model=build_tiny_model(tok, **SMALL), reward_funcs=varied_reward, args=args,
                       train_dataset=prompt_dataset(16), processing_class=tok)  # fmt: skip


def kto(output_dir: str, max_steps: int):
    """KTO: its reference point over both processes' rows, a reference model (partitioned under ZeRO-3)."""
    from replayrl import KTOConfig, KTOTrainer
    from replayrl.models.tiny import build_tiny_model, build_tokenizer
    from replayrl.tasks.preferences import preference_datasets

    tok = build_tokenizer()
    args = KTOConfig(**common(output_dir, max_steps, per_device_train_batch_size=4, bf16=False))
    return KTOTrainer(build_tiny_model(tok, **SMALL), args=args, train_dataset=preference_datasets(0, 1)[0],
                      processing_class=tok)  # fmt: skip


def reward(output_dir: str, max_steps: int):
    from replayrl import RewardConfig, RewardTrainer
    from replayrl.models.tiny import build_tiny_sequence_classifier, build_tokenizer
    from replayrl.tasks.preferences import preference_datasets

    tok = build_tokenizer()
    data = preference_datasets(seed=0, per_problem=1, rejected="near_miss")[0].select(range(8))
    args = RewardConfig(**common(output_dir, max_steps, per_device_train_batch_size=2))
    model = build_tiny_sequence_classifier(tok, seed=0, **SMALL)
    return RewardTrainer(model, args=args, train_dataset=data, processing_class=tok)


def distillation(output_dir: str, max_steps: int):
    """On-policy distillation: sampling, a partitioned teacher under ZeRO-3."""
    from replayrl import DistillationConfig, DistillationTrainer
    from replayrl.models.tiny import build_tiny_model, build_tokenizer, prompt_dataset

    tok = build_tokenizer()
    settings = dict(per_device_train_batch_size=4, beta=0.5, max_completion_length=6, bf16=False)
    args = DistillationConfig(**common(output_dir, max_steps, **settings, gradient_checkpointing=False))
    student, teacher = build_tiny_model(tok, seed=0, **SMALL), build_tiny_model(tok, seed=1, **SMALL)
    return DistillationTrainer(student, teacher, args=args, train_dataset=prompt_dataset(16), processing_class=tok)


def grpo(output_dir: str, max_steps: int, replay: bool = False):
    """GRPO (sampling, a KL term against the reference: a partitioned engine under ZeRO-3) or, with ``replay``,
    GRPOWithReplayBufferTrainer (its buffer is in every rank's state file; no reference)."""
    from replayrl import GRPOConfig, GRPOTrainer, GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
    from replayrl.models.tiny import build_tiny_model, build_tokenizer, prompt_dataset
    from tests.grpo.fsdp_worker import varied_reward

    tok = build_tokenizer()
    settings = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=6, bf16=False)
    settings.update(gradient_checkpointing=False, **(dict(replay_buffer_size=8, beta=0.0) if replay else {"beta": 0.1}))
    config, trainer = (GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer) if replay else (GRPOConfig, GRPOTrainer)
    return trainer(model=build_tiny_model(tok, **SMALL), reward_funcs=varied_reward,
                   args=config(**common(output_dir, max_steps, **settings)), train_dataset=prompt_dataset(16),
                   processing_class=tok)  # fmt: skip


def grpo_replay(output_dir: str, max_steps: int):
    return grpo(output_dir, max_steps, replay=True)


BUILDERS = {
    "grpo": grpo,
    "grpo_replay": grpo_replay,
    "sft": sft,
    "dpo": dpo,
    "rloo": rloo,
    "kto": kto,
    "reward": reward,
    "distillation": distillation,
}


def run(name: str, out: str) -> dict:
    """Every process: a 4-step run that saves checkpoint-2 on its way, and a new trainer (in another output_dir)
    resumed from that checkpoint to step 4; returns their logged metrics, whole parameters, the parameters before
    training, the checkpoint's files and (GRPO with replay) both final buffers."""
    from tests.grpo.fsdp_worker import buffer_of

    build = BUILDERS[name]
    straight = build(os.path.join(out, "straight"), 4)
    initial = full_params(straight.model)
    straight.train()
    checkpoint = Path(out) / "straight" / "checkpoint-2"
    resumed = build(os.path.join(out, "resumed"), 4)
    resumed.train(resume_from_checkpoint=str(checkpoint))

    def logs(trainer) -> list[dict]:
        return [{k: v for k, v in h.items() if not k.startswith("timing/")} for h in trainer.state.log_history
                if "loss" in h]  # fmt: skip

    return {
        "resumed_logs": logs(resumed),
        "straight_logs": logs(straight),
        "resumed": full_params(resumed.accelerator.unwrap_model(resumed.model)),
        "straight": full_params(straight.accelerator.unwrap_model(straight.model)),
        "initial": initial,
        "sharding": sharding_report(resumed.model),
        "checkpoint": sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*")),
        "buffers": [buffer_of(t) for t in (resumed, straight) if getattr(t, "replay_buffer", None) is not None],
    }
