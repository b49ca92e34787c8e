"""A GRPO-with-replay run reporting to trackio and TensorBoard with `log_completions` (run by test_trackers.py in
its own process, so that trackio, which reads TRACKIO_DIR once at import, writes under the test's folder).

    python tracker_worker.py OUTPUT_DIR TRACKER[,TRACKER...]   (TRACKIO_DIR / WANDB_DIR set by the caller)
"""

import sys

import torch

from replayrl import GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from replayrl.models.tiny import build_tiny_model, build_tokenizer, prompt_dataset

PROJECT, RUN = "replayrl-trackers", "grpo-replay"


def task_reward(completions, task, **kwargs):
    """'count' prompts: every completion scores 0 (a zero-std group the buffer replaces); others: varied."""
    return [0.0 if t == "count" else float(sum(map(ord, c)) % 5) for c, t in zip(completions, task)]


def length_reward(completions, **kwargs):
    return [len(c) / 10 for c in completions]


if __name__ == "__main__":
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = GRPOWithReplayBufferConfig(
        output_dir=sys.argv[1], per_device_train_batch_size=8, num_generations=4, max_completion_length=6,
        max_prompt_length=32, max_steps=6, learning_rate=5e-2, beta=0.0, replay_buffer_size=8, logging_steps=1,
        save_strategy="no", report_to=sys.argv[2].split(","), log_completions=True, project=PROJECT,
        run_name=RUN, reward_weights=[1.0, 0.0], use_cpu=True, seed=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = GRPOWithReplayBufferTrainer(
        model=model,
        reward_funcs=[task_reward, length_reward],
        args=args,
        train_dataset=prompt_dataset(16),
        processing_class=tokenizer,
    )
    trainer.train()
