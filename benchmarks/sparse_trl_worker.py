"""One run of TRL's GRPOTrainer on the sparse task `echo` of `replay_sparse.py`, or with `--task` on a task of
`replay_tasks.py` (its settings, stopping at the task's target unless `--full`); prints `RESULT {json}` (per-step log).

Not meant to be run by hand (`replay_sparse.py --arms trl_grpo` and `replay_tasks.py --arms trl_grpo` call it inside
the TRL virtualenv), but it can be:

    .venv-trl/bin/python benchmarks/sparse_trl_worker.py --model-dir DIR --data-file FILE --seed 0 --steps 200

It imports only the standard library and `replay_sparse` (itself standard-library only at module level) before
`main`, so the reward function and the settings are the very objects the replayrl arms use. `trl_settings` maps
replayrl's plain-GRPO arm to TRL's `GRPOConfig`, field by field.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_sparse import DIAGNOSTICS, SETTINGS, echo_reward  # noqa: E402

# replayrl GRPOConfig defaults that the `grpo` arm runs with and that are not in SETTINGS, spelled out for TRL so
# that none of TRL's own defaults leaks in (TRL 1.16 differs on bf16 and gradient checkpointing, both on by default).
REPLAYRL_DEFAULTS = dict(
    loss_type="dapo",
    scale_rewards="group",
    epsilon=0.2,
    epsilon_high=0.2,
    num_iterations=1,
    steps_per_generation=1,
    top_p=1.0,
    min_p=None,
    repetition_penalty=1.0,
    mask_truncated_completions=False,
    importance_sampling_level="token",
    max_grad_norm=1.0,
    weight_decay=0.0,
    warmup_steps=0,
    bf16=False,
    gradient_checkpointing=False,
    shuffle_dataset=True,
    disable_dropout=False,
    use_bias_correction_kl=False,  # only acts on the KL term; beta is 0 here
)


TRANSFORMERS_DEFAULT_TOP_K = 50  # what transformers' generate uses when GenerationConfig.top_k is None


def trl_settings(steps: int, seed: int, output_dir: str, overrides: dict | None = None, base: dict = SETTINGS) -> dict:
    """TRL GRPOConfig kwargs equal to replayrl's `grpo` arm (then `overrides`). Two fields cannot be passed as is:

    - `max_prompt_length=16`: TRL 1.16 has no such field (it never truncates prompts); the task's prompts are 4-5
      characters (`"7+5="`), so replayrl never truncates them either.
    - `top_k=None`: replayrl documents None as "no top-k", but it passes None to transformers' GenerationConfig,
      and `generate` then fills the unset field with transformers' default, 50 (checked: a `TopKLogitsWarper(50)`
      is built), so replayrl's arms sample from the 50 most likely of the 101 tokens. TRL gets `top_k=50`, what
      replayrl actually ran; TRL's own "disabled" value is 0 (arm `trl_grpo_topk0`).
    """
    settings = {k: v for k, v in base.items() if k != "max_prompt_length"}
    settings["top_k"] = TRANSFORMERS_DEFAULT_TOP_K if base["top_k"] is None else base["top_k"]
    run = {"max_steps": steps, "seed": seed, "output_dir": output_dir}
    return {**settings, **REPLAYRL_DEFAULTS, **(overrides or {}), **run}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", required=True, help="the saved random-init tiny model + tokenizer")
    p.add_argument("--data-file", required=True, help="JSON lines with a `prompt` column")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--overrides", default="{}", help="JSON object of GRPOConfig fields over the mapped settings")
    p.add_argument("--task", default=None, help="a task of replay_tasks.py (default: replay_sparse.py's echo)")
    p.add_argument("--full", action="store_true", help="with --task: run every step, not only to the target")
    args = p.parse_args(argv)
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    rows = [json.loads(line) for line in Path(args.data_file).read_text().splitlines() if line.strip()]
    reward, base, record = echo_reward, SETTINGS, {}
    if args.task is not None:
        import replay_tasks

        _, reward, target, _ = replay_tasks.TASKS[args.task]
        base = replay_tasks.SETTINGS
    settings = trl_settings(args.steps, args.seed, args.output_dir, json.loads(args.overrides), base)
    config = trl.GRPOConfig(**settings)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)
    if args.task is not None:
        trainer.add_callback(replay_tasks.progress_callback(None if args.full else target, record))
    start = time.perf_counter()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    if args.task is not None:  # completion tokens of the groups with reward variance (all have a non-zero advantage)
        batch = settings["per_device_train_batch_size"]
        per_step = [(1 - h.get("frac_reward_zero_std", 0)) * h.get("completions/mean_length", 0) * batch for h in logs]
        record["gradient_tokens"] = [sum(per_step[: i + 1]) for i in range(len(per_step))]
    result = {
        "trl_version": trl.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "trl_config": {k: str(v) for k, v in settings.items()},
        "reward": [h["reward"] for h in logs],
        "diagnostics": {k: [h.get(k) for h in logs] for k in DIAGNOSTICS},
        "seconds": time.perf_counter() - start,
        **{k: v for k, v in record.items() if k in ("seconds", "gradient_tokens")},
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
