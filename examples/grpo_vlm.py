"""GRPO on a vision-language model, TRL-style, offline: `python examples/grpo_vlm.py [output_dir]`.

A user with a hub model writes the same code with `AutoModelForImageTextToText.from_pretrained(name)` and
`AutoProcessor.from_pretrained(name)` (or passes the name and leaves processing_class out); here a tiny LLaVA is
built from a config and saved, then loaded by path as a hub model would be. The dataset has an `image` column and
conversational prompts; each image becomes a `{"type": "image"}` part of the first user message (docs/vlm.md).
"""

import sys
import tempfile

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.models.tiny_vlm import build_tiny_processor, build_tiny_vlm
from replayrl.tasks.shapes import shape_dataset, shape_reward

model_path = tempfile.mkdtemp()
build_tiny_vlm("llava").save_pretrained(model_path)  # was: a hub name such as "llava-hf/llava-1.5-7b-hf"
build_tiny_processor("llava").save_pretrained(model_path)
dataset = shape_dataset(16, size=28)  # columns: prompt (chat), image (PIL), answer ("R", "G" or "B")

training_args = GRPOConfig(
    output_dir=sys.argv[1] if len(sys.argv) > 1 else "./tmp-grpo-vlm",
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=4,
    max_prompt_length=None,  # prompts with images are never truncated
    max_steps=4,
    logging_steps=1,
    report_to="none",
)
trainer = GRPOTrainer(model=model_path, reward_funcs=shape_reward, args=training_args, train_dataset=dataset)
trainer.train()
print(f"trained {trainer.state.global_step} steps on {type(trainer.model).__name__}")
