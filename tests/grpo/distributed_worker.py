"""Run under `accelerate launch --num_processes 2` by tests/test_distributed.py (CPU, gloo).

grpo:   one SGD step of GRPOTrainer; saves the global batch that was trained on and the parameters after the
        step, so the test can recompute the same step in a single process.
replay: GRPOWithReplayBufferTrainer where rank 1's prompts only ever get zero-std rewards; saves what each rank
        trained on and its buffer, to show one logical buffer across processes.
replay_rollout: the same with replay_unit="rollout" (rollouts drawn across the buffer, one draw for all ranks).
"""

import os
import sys

import torch
from accelerate.utils import gather_object

from replayrl import GRPOConfig, GRPOTrainer, GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from replayrl.distributed import end_distributed
from replayrl.models.tiny import build_tiny_model, build_tokenizer, prompt_dataset
from tests.distributed.launch import full_params, run_settings, setup_worker, sharding_report


def varied_reward(completions, **kwargs):
    return [float(sum(map(ord, c)) % 7) for c in completions]


def rank1_is_flat(completions, **kwargs):
    if int(os.environ.get("RANK", "0")) == 1:
        return [0.0] * len(completions)
    return varied_reward(completions)


def common(out):
    return dict(
        output_dir=out,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_prompt_length=32,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        **run_settings(),
        seed=0,
        disable_tqdm=True,
    )


def grpo_step(out: str, peft_config=None, reward_model=None, **overrides) -> dict:
    """One SGD step of GRPOTrainer (every process calls it): the global batch trained on, the parameters after
    the step (whole), the logged loss, the completions each process sampled. With ``reward_model`` (a sequence
    classifier) as the reward: what it scored on this process, and how its parameters are held."""
    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    settings = dict(max_steps=1, optim="sgd", learning_rate=1.0, max_grad_norm=0.0, beta=0.1)
    args = GRPOConfig(**common(out), **{**settings, **overrides})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=varied_reward if reward_model is None else reward_model,
        args=args,
        train_dataset=prompt_dataset(16),
        processing_class=tok,
        peft_config=peft_config,
        reward_processing_classes=None if reward_model is None else tok,
    )
    scored = spy_reward_model(trainer)
    held = []  # elements of the policy's parameters this process holds whole while generating
    generate = trainer.generator.generate

    def spy(*a, **kw):
        held.append(sum(p.numel() for p in trainer.accelerator.unwrap_model(trainer.model).parameters()))
        return generate(*a, **kw)

    trainer.generator.generate = spy
    trainer.train()
    batches = gather_object([[mb.to("cpu").state_dict() for mb in trainer._micro_batches]])
    return {
        "batches": batches,
        "params": full_params(trainer.accelerator.unwrap_model(trainer.model)),
        "loss": trainer.state.log_history[0]["loss"],
        "world": trainer.accelerator.num_processes,
        "sharding": sharding_report(trainer.model),
        "held_while_generating": held,
        "ref_sharding": None if trainer.ref_model is None else sharding_report(trainer.ref_model),
        "reward_model_scores": scored,
        "reward_model_sharding": [sharding_report(m) for m in trainer.reward_funcs.models()],
    }


def spy_reward_model(trainer) -> list:
    """Records (prompts, completions, scores) of every reward-model call on this process."""
    scored, score = [], trainer.reward_funcs._score_with_model

    def spy(model, tokenizer, prompts, completions):
        scores = score(model, tokenizer, prompts, completions)
        scored.append((list(prompts), list(completions), scores))
        return scores

    trainer.reward_funcs._score_with_model = spy
    return scored


def main(mode: str, out: str) -> None:
    setup_worker()
    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    if mode == "grpo":
        result = grpo_step(out)
        if int(os.environ.get("RANK", "0")) == 0:
            torch.save(result, os.path.join(out, "result.pt"))
    else:
        args = GRPOWithReplayBufferConfig(
            **common(out), max_steps=4, replay_buffer_size=8, beta=0.0, learning_rate=1e-2,
            per_device_eval_batch_size=4, replay_unit="rollout" if mode == "replay_rollout" else "group",
        )  # fmt: skip
        trainer = GRPOWithReplayBufferTrainer(
            model=model, reward_funcs=rank1_is_flat, args=args, train_dataset=prompt_dataset(32), processing_class=tok
        )
        seen = []
        original = trainer.compute_loss

        def spy(model, inputs, *a, **kw):
            seen.append(inputs.replayed.clone())
            return original(model, inputs, *a, **kw)

        trainer.compute_loss = spy
        trainer.train()
        buffer = [(g.uid, round(g.score, 6), g.version, g.reuse) for g in trainer.replay_buffer.groups]
        summary = {
            "rank": trainer.accelerator.process_index,
            "buffer": buffer,
            "replayed_rows": int(sum(s.sum() for s in seen)),
            "logs": trainer.state.log_history,
        }
        everything = gather_object([summary])
        if trainer.accelerator.is_main_process:
            torch.save(everything, os.path.join(out, "result.pt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    end_distributed()
