"""TRL's GRPOWithReplayBuffer documentation usage example, run as written with only the model and dataset swapped for
local ones (no hub): `python examples/grpo_with_replay_buffer.py [output_dir]`."""

import sys
import tempfile

import torch

from replayrl import GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from replayrl.models.tiny import prompt_dataset, save_tiny

dataset = prompt_dataset(32)  # was: load_dataset("trl-internal-testing/zen", "standard_prompt_only", split="train")
model_path = save_tiny(tempfile.mkdtemp())  # was: "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"


# Guarantee that some rewards have 0 std
def custom_reward_func(completions, **kwargs):
    if torch.rand(1).item() < 0.25:
        return [0] * len(completions)  # simulate some None rewards
    else:
        return torch.rand(len(completions)).tolist()


training_args = GRPOWithReplayBufferConfig(
    output_dir=sys.argv[1] if len(sys.argv) > 1 else "./tmp",
    learning_rate=1e-4,
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=8,
    replay_buffer_size=8,
    report_to="none",
)

trainer = GRPOWithReplayBufferTrainer(
    model=model_path,
    reward_funcs=[custom_reward_func],
    args=training_args,
    train_dataset=dataset,
)

previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}

trainer.train()

changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(previous_trainable_params[n], p)]
print(
    f"{len(changed)}/{len(previous_trainable_params)} parameter tensors changed; "
    f"buffer holds {len(trainer.replay_buffer)} groups"
)
