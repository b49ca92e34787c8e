"""GRPO with an environment (TRL's `environment_factory`), fully offline: the built-in `CounterEnv` gives each
rollout a target, exposes its `increment` method as a tool, and owns the reward (so no `reward_funcs`).
`python examples/grpo_environment.py [output_dir]`.

The tiny random model here rarely produces a well-formed tool call, so the reward stays near 0: the example shows the
wiring. For a policy that learns to call a tool, start from `replayrl.tasks.calculator.build_calculator_model`.
"""

import sys

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.models.tiny import build_tiny_model
from replayrl.tasks.calculator import build_tool_tokenizer
from replayrl.tasks.counter import CounterEnv, counter_dataset

tokenizer = build_tool_tokenizer()  # a chat template that renders tools, tool calls and tool results
model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)

training_args = GRPOConfig(
    output_dir=sys.argv[1] if len(sys.argv) > 1 else "./tmp",
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=32,
    max_prompt_length=None,
    max_tool_calling_iterations=2,
    max_steps=2,
    logging_steps=1,
    use_cpu=True,
    report_to="none",
)

trainer = GRPOTrainer(
    model=model,
    processing_class=tokenizer,
    args=training_args,
    train_dataset=counter_dataset(8),  # a `target` column, passed to CounterEnv.reset(target=...)
    environment_factory=CounterEnv,  # one instance per rollout; its get_reward() is the reward
)
trainer.train()
print([round(h["rewards/CounterEnv/mean"], 3) for h in trainer.state.log_history if "loss" in h])
