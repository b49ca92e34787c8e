"""`replayrl rloo [--config recipe.yaml] [--<field> value ...]`: train with RLOO, plot, summarise.

Every `RLOOConfig` field (TRL 1.16's, so every `transformers.TrainingArguments` field too) is a flag, plus
`replayrl grpo`'s data and reward flags (--dataset_name, --prompt_column, --system_prompt, --reward_funcs,
--reward_model_name_or_path, ...) and `ModelConfig`'s (--model_name_or_path, loading options, --use_peft and LoRA),
as TRL's `trl rloo`. Values: CLI defaults < the built-in job's settings (only without a model and a dataset) <
the --config recipe < flags. Data, rewards, model and trainer are built as `replayrl grpo` builds them, with
RLOOTrainer (RLOO runs on GRPO's rollout).

Built-in job: `replayrl grpo`'s addition task (replayrl/tasks/addition.py: a tiny Qwen2 warmed up on a noisy
teacher, right about a quarter of the time, 0/1 exact-match reward) trained with RLOO's leave-one-out baseline;
evaluated on the 20 held-out operand pairs it never trains on. Offline, about a minute on CPU.
"""

from __future__ import annotations

from typing import Any

from replayrl.cli.common import builtin_job, parse_command, run_job
from replayrl.cli.grpo import ScriptArguments, build_trainer
from replayrl.models.model_config import ModelConfig
from replayrl.rloo import RLOOConfig
from replayrl.tasks import addition

DEFAULT_CONFIG: dict[str, Any] = {
    **{k: v for k, v in addition.DEFAULT_CONFIG.items() if not k.startswith("replay_")},
    "max_steps": 200,
    "beta": 0.05,  # TRL's RLOO default: the KL panel of the plot
    "bf16": False,  # the tiny model runs faster in fp32 on CPU
    "gradient_checkpointing": False,
    "save_steps": 100,
}
# the built-in job's held-out curve rises with 8 completions per prompt; TRL's default is 2
DEFAULT_CONFIG["num_generations"] = 8


def run(argv: list[str]) -> int:
    # RLOOConfig before ModelConfig: the config owns the shared --trust_remote_code flag, as for `replayrl grpo`
    types = (ScriptArguments, RLOOConfig, ModelConfig)
    script, config, model_args = parse_command("rloo", types, argv, DEFAULT_CONFIG, description="Train with RLOO.")
    describe = f"{model_args.model_name_or_path} on {script.dataset_name}"
    if builtin_job(script, model_args):
        describe = f"built-in job: {addition.TASK_DESCRIPTION}"
    describe += f"; G={config.num_generations}, beta {config.beta}"
    tiny = model_args.model_name_or_path is None

    def build():
        from replayrl.rloo import RLOOTrainer

        return build_trainer(script, model_args, config, RLOOTrainer)

    return run_job("rloo", config, build, describe, summary=("reward", "loss"), tiny=tiny, saved="final model")
