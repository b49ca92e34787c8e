"""Does replay halve the rollouts on every task? Completions generated to a target reward on seven small tasks (five
sparse, two dense; from a random-init and from a warmed-up tiny policy), plain GRPO against replay arms and TRL's
GRPOTrainer, several seeds, with bootstrap intervals (issue 30; docs/replay.md).

    python benchmarks/replay_tasks.py                                     # every task x the main arms, seeds 0-7
    python benchmarks/replay_tasks.py --tasks echo sum --arms grpo default --seeds 0 1 --tag a   # a slice
    python benchmarks/replay_tasks.py --report replay_tasks_a.json replay_tasks_b.json --plot replay_tasks.png
    python benchmarks/replay_tasks.py --quick                             # smoke run: 1 seed, 2 tasks, 2 arms

Tasks (prompts: the 80 training prompts "a+b=" of the addition task; a completion is at most 2 tokens, one character
each). `init` is the policy the run starts from: `random` = a random-init tiny Qwen2 (hidden 64, 2 layers, ~100-token
vocabulary, ~1% of completions right at first); `warm` = the same after a short supervised warm-up on a noisy
teacher that writes 1-2 digits, each drawn uniformly from the prompt's operands and the digits of their sum, blind to
which order is right: the policy writes plausible digits, a few percent of its answers are right.

| task | init | reward | structure |
|---|---|---|---|
| echo | random | 1 if the completion starts with the prompt's first character | one-token copy |
| repeat | random | 1 if the completion is two equal characters | format constraint |
| larger | random | 1 if the completion starts with the larger operand | one-token comparison |
| pair | warm | 1 if the completion is the two operands, "a+b=" -> "ab" | multi-token target string |
| sum | warm | 1 if the completion is the sum (target 0.25) | short arithmetic answer |
| near_echo | random | max(0, 1 - |first char - prompt's first char| / 10), by code point | dense |
| near_sum | warm | max(0, 1 - |number - sum| / 10), 0 if not a number | dense |

The x axis is completions generated: dynamic sampling pays for every round. "to target" = completions until the
moving average (WINDOW steps) of the fresh completions' reward first reaches the task's target; a run stops there
(`--full` runs every step). A run that never gets there counts as its length and is shown censored ('+'). Per arm and
task: the median over seeds with a bootstrap 95% interval (seeds resampled), the ratio of medians to plain GRPO and to
TRL (bootstrap interval too), gradient-carrying tokens (completion tokens with a non-zero advantage that reached the
loss, replayed ones included) per completion generated, and the wall-clock seconds to the target.

Arms with `prompt_skipping` (GRESO: `append_skip`, `grpo_skip`) generate a chosen set of prompts, so their fresh
reward is biased; they are judged by the reward of G completions sampled, outside the run's random stream and not
counted, for every prompt the sampler drew (what the other arms' fresh reward measures); `--report ... --judge
fresh_reward|weighted_reward|imputed_reward` judges them by the trainer's own estimates instead.

Arm `trl_grpo` runs TRL's GRPOTrainer in its own virtualenv (`sparse_trl_worker.py --task`, the same settings mapped
field by field, the same saved initial model, prompts and reward function). This module imports only the standard
library at module level: the TRL worker imports the tasks from it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, median, print_table, remove_scratch, write_results  # noqa: E402
from sample_efficiency import _first_reaching, smooth  # noqa: E402

WINDOW = 5
STEPS = 200
SETTINGS = dict(
    per_device_train_batch_size=64,  # 8 prompts x G=8
    num_generations=8,
    max_prompt_length=16,
    max_completion_length=2,
    temperature=1.0,
    top_k=50,  # as replay_sparse.py (what its documented runs sampled with)
    learning_rate=3e-3,
    lr_scheduler_type="constant",
    beta=0.0,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    disable_tqdm=True,
    use_cpu=True,
)
MODEL_KWARGS = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
WARMUP_STEPS, WARMUP_ANSWERS = 150, 8  # learning rate and batch: the built-in task's (3e-3, 64)


def _operands(prompt: str) -> tuple[int, int]:
    a, b = str(prompt).rstrip("=").split("+")
    return int(a), int(b)


def echo_reward(completions, prompts, **kwargs) -> list[float]:
    return [float(str(c)[:1] == str(p)[:1]) for c, p in zip(completions, prompts)]


def repeat_reward(completions, prompts, **kwargs) -> list[float]:
    return [float(len(str(c)) == 2 and str(c)[0] == str(c)[1]) for c in completions]


def larger_reward(completions, prompts, **kwargs) -> list[float]:
    return [float(str(c)[:1] == str(max(_operands(p)))) for c, p in zip(completions, prompts)]


def pair_reward(completions, prompts, **kwargs) -> list[float]:
    return [float(str(c) == "".join(map(str, _operands(p)))) for c, p in zip(completions, prompts)]


def sum_reward(completions, prompts, **kwargs) -> list[float]:
    return [float(str(c) == str(sum(_operands(p)))) for c, p in zip(completions, prompts)]


def near_echo_reward(completions, prompts, **kwargs) -> list[float]:
    out = []
    for c, p in zip(completions, prompts):
        out.append(max(0.0, 1.0 - abs(ord(str(c)[0]) - ord(str(p)[0])) / 10) if str(c) else 0.0)
    return out


def near_sum_reward(completions, prompts, **kwargs) -> list[float]:
    out = []
    for c, p in zip(completions, prompts):
        c = str(c)
        out.append(max(0.0, 1.0 - abs(int(c) - sum(_operands(p))) / 10) if c.isdigit() else 0.0)
    return out


# task -> (initial policy, reward function, target of the smoothed reward, dense?)
TASKS: dict[str, tuple[str, object, float, bool]] = {
    "echo": ("random", echo_reward, 0.5, False),
    "repeat": ("random", repeat_reward, 0.5, False),
    "larger": ("random", larger_reward, 0.5, False),
    "pair": ("warm", pair_reward, 0.5, False),
    "sum": ("warm", sum_reward, 0.25, False),  # 0.5: no arm of any seed within 200 steps (12.8k completions)
    "near_echo": ("random", near_echo_reward, 0.8, True),
    "near_sum": ("warm", near_sum_reward, 0.8, True),
}
# arm -> (trainer, config overrides). `replace` is the replay default before issue 30 (swap, importance cap 2, max
# age 10); `append` the default from then (fresh-anchored, one buffered group per zero-std group); since the
# rollout-level arms, `append_rollout_pos` is the default (GRPOWithReplayBufferConfig()); `default_async` is
# GRPOWithReplayBufferConfig() as it is, with asynchronous generation.
ARMS: dict[str, tuple[str, dict]] = {
    "grpo": ("grpo", {}),
    "replace": ("replay", {"replay_placement": "replace"}),
    "append": ("replay", {"replay_placement": "append", "replay_unit": "group"}),
    "mix_group": ("replay", {"replay_strategy": "mix_then_group", "replay_placement": "replace"}),
    "mix_group_append": (
        "replay",
        {"replay_strategy": "mix_then_group", "replay_placement": "append", "replay_unit": "group"},
    ),
    "m2po": ("replay", {"replay_placement": "replace", "replay_m2_threshold": 0.04, "replay_importance_cap": None}),
    "append_m2po": (
        "replay",
        {
            "replay_placement": "append",
            "replay_unit": "group",
            "replay_m2_threshold": 0.04,
            "replay_importance_cap": None,
        },
    ),
    "dynamic": ("grpo", {"dynamic_sampling": True, "dynamic_sampling_max_rounds": 3}),
    "dynamic_append": (
        "replay",
        {
            "dynamic_sampling": True,
            "dynamic_sampling_max_rounds": 3,
            "replay_placement": "append",
            "replay_unit": "group",
        },
    ),
    "default_async": ("replay", {"async_generation": True}),
    # GRESO-style prompt skipping (arXiv 2506.02177) with the group-level append, and alone on plain GRPO
    "append_skip": ("replay", {"replay_placement": "append", "replay_unit": "group", "prompt_skipping": True}),
    "grpo_skip": ("grpo", {"prompt_skipping": True}),
    "trl_grpo": ("trl", {}),
    # rollout-level priorities (arXiv 2606.04560): G buffered rollouts per zero-std group, drawn by |A| / max(A, 0);
    # `append_rollout_pos` is GRPOWithReplayBufferConfig() since (written out: the arm keeps its meaning)
    "append_rollout": (
        "replay",
        {"replay_placement": "append", "replay_unit": "rollout", "replay_rollout_priority": "abs_advantage"},
    ),
    "append_rollout_pos": (
        "replay",
        {"replay_placement": "append", "replay_unit": "rollout", "replay_rollout_priority": "positive_advantage"},
    ),
    # two optimizer steps per generation batch (mu = num_iterations = 2): `steps` counts generation batches
    "append_mu2": ("replay", {"replay_placement": "append", "replay_unit": "group", "num_iterations": 2}),
    "grpo_mu2": ("grpo", {"num_iterations": 2}),
}
MAIN_ARMS = ["grpo", "append", "append_rollout", "append_rollout_pos", "trl_grpo"]


def teacher_answer(a: int, b: int, rng: random.Random) -> str:
    """One answer of the noisy teacher: 1 or 2 digits, each drawn from the operands and the digits of the sum."""
    digits = sorted({str(a), str(b), *str(a + b)})
    return "".join(rng.choice(digits) for _ in range(rng.randint(1, 2)))


def warm_up(model, tokenizer, seed: int) -> None:
    """Supervised warm-up on the noisy teacher, WARMUP_ANSWERS answers per prompt (plain torch, seeded): the built-in
    task's warm-up loop on these answers. The policy learns the format and which digits are plausible, nothing about
    which answer is right."""
    import torch

    from replayrl.tasks.addition import problems
    from replayrl.tasks.addition import warm_up as addition_warm_up

    rng = random.Random(seed)
    examples = [(f"{a}+{b}=", teacher_answer(a, b, rng)) for a, b in problems() for _ in range(WARMUP_ANSWERS)]
    with torch.random.fork_rng(devices=[]):
        addition_warm_up(model, tokenizer, seed, steps=WARMUP_STEPS, examples=examples)


def initial_policy(task: str, seed: int):
    """(model, tokenizer, training prompts) a run of `task` starts from: the same for every arm of a seed."""
    from replayrl.models.tiny import build_tiny_model, build_tokenizer
    from replayrl.tasks.addition import task_datasets

    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed, **MODEL_KWARGS)
    if TASKS[task][0] == "warm":
        warm_up(model, tokenizer, seed)
    return model, tokenizer, task_datasets(seed)[0]


def population_reward(logs: dict) -> float:
    """The reward a run is judged by: that of its fresh completions, except with prompt skipping, whose generated
    prompts are a biased choice: there, the reward of G completions sampled (not trained on, not counted) for each
    prompt of the sampler's own draw (`_measuring`): the same estimate as the fresh reward of the other arms."""
    return logs.get(DRAWN_REWARD, logs["reward"])


DRAWN_REWARD = "benchmark/drawn_reward"


def _measuring(cls):
    """`cls` that, with prompt skipping, also samples G completions for every prompt the sampler drew (skipped or
    not) from the current policy, outside the run's random stream, and logs their mean reward as DRAWN_REWARD: what
    the other arms' `reward` measures. Nothing of it is trained on or counted as generated."""

    class Measuring(cls):
        def _generate_training_batch(self, inputs):
            if self.prompt_history is not None:
                self._metrics["train"][DRAWN_REWARD].append(self._sample_drawn_reward(inputs))
            return super()._generate_training_batch(inputs)

        def _sample_drawn_reward(self, inputs) -> float:
            import torch

            from replayrl.grpo.generation import generate_batch

            prompts = [row["prompt"] for row in inputs]
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                gen = generate_batch(self, self._prompt_texts(prompts), "eval", add_special_tokens=True)
            ids = [c[m.bool()].tolist() for c, m in zip(gen.completion_ids, gen.completion_mask)]
            completions = self.processing_class.batch_decode(ids, skip_special_tokens=True)
            rewards = self.reward_funcs.funcs[0](completions=completions, prompts=prompts)
            return sum(rewards) / len(rewards)

    return Measuring


def progress_callback(target: float | None, record: dict):
    """A TrainerCallback that records each logged step's wall-clock time and stops the run once the WINDOW-step
    moving average of the training reward reaches `target` (None: never stops early)."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            record.update(start=time.perf_counter(), seconds=[], rewards=[])

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                record["seconds"].append(time.perf_counter() - record["start"])
                record["rewards"].append(population_reward(logs))
                if target is not None and smooth(record["rewards"], WINDOW)[-1] >= target:
                    control.should_training_stop = True

    return Progress()


def _counting(cls):
    """`cls` that also counts, per optimizer step, the completion tokens with a non-zero advantage reaching the loss."""

    class Counting(cls):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training:
                real = inputs.completion_mask.bool() & (inputs.advantages != 0).unsqueeze(1)
                counts = self.__dict__.setdefault("gradient_tokens", {})
                counts[self.state.global_step + 1] = counts.get(self.state.global_step + 1, 0) + int(real.sum())
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    return Counting


def run_arm(task: str, arm: str, seed: int, steps: int, output_dir: str, full: bool, trl_python=None) -> dict:
    if ARMS[arm][0] == "trl":
        return run_trl_arm(task, arm, seed, steps, output_dir, full, trl_python)
    from transformers import PrinterCallback

    from replayrl import GRPOConfig, GRPOTrainer, GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer

    kind, overrides = ARMS[arm]
    # `steps` counts generation batches: with num_iterations = mu, each is trained on mu optimizer steps
    max_steps = steps * overrides.get("num_iterations", 1)
    settings = {**SETTINGS, **overrides, "max_steps": max_steps, "seed": seed, "output_dir": output_dir}
    if kind == "replay":
        config, cls = GRPOWithReplayBufferConfig(**settings), GRPOWithReplayBufferTrainer
    else:
        config, cls = GRPOConfig(**settings), GRPOTrainer
    model, tokenizer, train = initial_policy(task, seed)
    record: dict = {}
    trainer = _measuring(_counting(cls))(
        model=model, reward_funcs=[TASKS[task][1]], args=config, train_dataset=train, processing_class=tokenizer
    )
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(progress_callback(None if full else TASKS[task][2], record))
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    generated = [h.get("dynamic_sampling/completions", config.per_device_train_batch_size) for h in logs]
    tokens = trainer.__dict__.get("gradient_tokens", {})
    return {
        "task": task,
        "arm": arm,
        "seed": seed,
        "reward": [population_reward(h) for h in logs],
        "fresh_reward": [h["reward"] for h in logs],
        "weighted_reward": [h.get("prompt_skipping/weighted_reward") for h in logs],
        "imputed_reward": [h.get("prompt_skipping/drawn_reward") for h in logs],
        "completions": [sum(generated[: i + 1]) for i in range(len(generated))],
        "gradient_tokens": [sum(tokens.get(s, 0) for s in range(1, h["step"] + 1)) for h in logs],
        "seconds": record["seconds"],
        "frac_reward_zero_std": [h.get("frac_reward_zero_std") for h in logs],
        "groups_replaced": [h.get("replay/groups_replaced") for h in logs],
        "prompts_skipped": [h.get("prompt_skipping/skipped") for h in logs],
    }


def run_trl_arm(task: str, arm: str, seed: int, steps: int, output_dir: str, full: bool, trl_python) -> dict:
    """TRL's GRPOTrainer in its own virtualenv, from the initial policy of `run_arm` saved to `output_dir`."""
    work = Path(output_dir)
    model_dir, data_file = work / "model", work / "prompts.jsonl"
    work.mkdir(parents=True, exist_ok=True)
    model, tokenizer, train = initial_policy(task, seed)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data_file.write_text("".join(json.dumps(r) + "\n" for r in train.to_list()))
    if trl_python is None:
        from vs_trl import ensure_trl_venv

        trl_python = str(ensure_trl_venv())
    cmd = [trl_python, str(Path(__file__).resolve().parent / "sparse_trl_worker.py"), "--model-dir", str(model_dir)]
    cmd += ["--data-file", str(data_file), "--seed", str(seed), "--steps", str(steps), "--task", task]
    cmd += ["--output-dir", str(work / "out"), "--overrides", json.dumps(ARMS[arm][1])] + (["--full"] if full else [])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.update(TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # the TRL venv must not see replayrl's environment
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"TRL worker failed (rc={proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    n = len(result["reward"])
    per_step = SETTINGS["per_device_train_batch_size"]
    result["completions"] = [per_step * (i + 1) for i in range(n)]
    return {"task": task, "arm": arm, "seed": seed, **result}


# ------------------------------------------------------------------------------------------------ statistics
def to_target(run: dict, target: float) -> tuple[int, float, bool, float]:
    """(completions, wall-clock seconds, reached?, gradient tokens per completion) when the smoothed reward first
    reaches `target`; a run that never does gives its totals."""
    step = _first_reaching(smooth(run["reward"], WINDOW), target) or len(run["reward"])
    reached = smooth(run["reward"], WINDOW)[step - 1] >= target
    completions = run["completions"][step - 1]
    tokens = run["gradient_tokens"][step - 1] / completions if run.get("gradient_tokens") else float("nan")
    return completions, run["seconds"][step - 1], reached, tokens


def bootstrap(values: list[float], other: list[float] | None = None, n: int = 2000) -> tuple[float, float]:
    """95% interval of the median of `values` (or of the ratio of medians `values` / `other`), seeds resampled."""
    rng = random.Random(0)
    stats = []
    for _ in range(n):
        m = median(rng.choices(values, k=len(values)))
        stats.append(m / median(rng.choices(other, k=len(other))) if other else m)
    stats.sort()
    return stats[int(0.025 * n)], stats[int(0.975 * n) - 1]


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for task, (init, _, target, dense) in TASKS.items():
        per_arm = {}
        for arm in ARMS:
            arm_runs = sorted((r for r in runs if r["task"] == task and r["arm"] == arm), key=lambda r: r["seed"])
            if arm_runs:
                per_arm[arm] = [to_target(r, target) for r in arm_runs]
        for arm, hits in per_arm.items():
            comp = [h[0] for h in hits]
            lo, hi = bootstrap(comp)
            row = {"task": task, "init": init, "dense": dense, "target": target, "arm": arm, "seeds": len(hits)}
            row.update(
                to_target=median(comp), ci=f"{lo:.0f}-{hi:.0f}", reached=f"{sum(h[2] for h in hits)}/{len(hits)}"
            )
            for ref in ("grpo", "trl_grpo"):
                if ref in per_arm and arm != ref:
                    other = [h[0] for h in per_arm[ref]]
                    a, b = bootstrap(comp, other)
                    row[f"x_{ref}"] = median(comp) / median(other)
                    row[f"x_{ref}_ci"] = f"{a:.2f}-{b:.2f}"
            row["grad_tokens_per_completion"] = median(h[3] for h in hits)
            row["seconds_to_target"] = median(h[1] for h in hits)
            row["per_seed"] = " ".join(f"{h[0] / 1000:.1f}k" + ("" if h[2] else "+") for h in hits)
            rows.append(row)
    return rows


COLUMNS = ["task", "init", "arm", "seeds", "reached", "to_target", "ci", "x_grpo", "x_grpo_ci", "x_trl_grpo"]
COLUMNS += ["x_trl_grpo_ci", "grad_tokens_per_completion", "seconds_to_target", "per_seed"]


def verdict(rows: list[dict]) -> list[dict]:
    """Per arm, the issue's criteria over the tasks it ran: worst ratio to GRPO and to TRL on the sparse tasks,
    wall-clock not above GRPO's, and dense tasks not worse than GRPO beyond the interval (ratio's interval > 1)."""
    out = []
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine or arm == "grpo":
            continue
        sparse = [r for r in mine if not r["dense"]]
        row = {"arm": arm, "tasks": len(mine)}
        for ref in ("grpo", "trl_grpo"):
            ratios = [r[f"x_{ref}"] for r in sparse if f"x_{ref}" in r]
            row[f"worst_sparse_x_{ref}"] = max(ratios) if ratios else float("nan")
        slower = []
        for r in sparse:
            ref = next((g for g in rows if g["task"] == r["task"] and g["arm"] == "grpo"), None)
            if ref is not None and r["seconds_to_target"] > ref["seconds_to_target"]:
                slower.append(r["task"])
        row["slower_than_grpo_on"] = " ".join(slower) or "-"
        worse = [r["task"] for r in mine if r["dense"] and "x_grpo_ci" in r and float(r["x_grpo_ci"].split("-")[0]) > 1]
        row["dense_worse_beyond_ci"] = " ".join(worse) or "-"
        out.append(row)
    return out


def report(runs: list[dict], markdown: bool = False) -> str:
    rows = summarize(runs)
    verdicts = verdict(rows)
    if markdown:
        return _markdown(rows, COLUMNS) + "\n\n" + _markdown(verdicts, list(verdicts[0]) if verdicts else ["arm"])
    text = print_table(rows, COLUMNS, title="\ncompletions to the task's target (median over seeds, 95% bootstrap)")
    cols = list(verdicts[0]) if verdicts else ["arm"]
    return text + "\n" + print_table(verdicts, cols, title="\nthe issue's criteria, per arm")


def _markdown(rows: list[dict], cols: list[str]) -> str:
    def fmt(v) -> str:
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    text = "\n".join(lines)
    print(text)
    return text


def plot(runs: list[dict], path: Path) -> None:
    """One panel per task: the median over seeds of the smoothed reward against completions generated, per arm; a run
    that stopped at its target is carried forward at its last value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in TASKS if any(r["task"] == t for r in runs)]
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.6 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for arm in ARMS:
            arm_runs = [r for r in runs if r["task"] == task and r["arm"] == arm]
            if not arm_runs:
                continue
            n = max(len(r["reward"]) for r in arm_runs)
            per_step = arm_runs[0]["completions"][0]
            curves = [smooth(r["reward"], WINDOW) for r in arm_runs]
            curves = [c + [c[-1]] * (n - len(c)) for c in curves]
            ax.plot([per_step * (i + 1) for i in range(n)], [median(c[i] for c in curves) for i in range(n)], label=arm)
        ax.axhline(TASKS[task][2], color="grey", lw=0.8, ls=":")
        ax.set_title(f"{task} ({TASKS[task][0]} init)", fontsize=9)
        ax.set_xlabel("completions generated", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"reward, {WINDOW}-step moving average (median)", fontsize=8)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: seed 0, tasks echo + sum, arms grpo + append")
    p.add_argument("--tasks", nargs="+", default=None, choices=list(TASKS), help="default: all")
    p.add_argument("--arms", nargs="+", default=None, choices=list(ARMS), help=f"default: {' '.join(MAIN_ARMS)}")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0-7 (quick: 0)")
    p.add_argument("--steps", type=int, default=None, help=f"optimizer steps per run at most (default {STEPS})")
    p.add_argument("--full", action="store_true", help="run every step (default: stop a run at its target)")
    p.add_argument("--tag", default=None, help="write replay_tasks_<tag>.json (to run slices)")
    p.add_argument("--trl-python", default=None, help="trl_grpo arm: TRL's interpreter (default: create .venv-trl)")
    p.add_argument("--report", nargs="+", default=None, help="print the tables of these result files and exit")
    p.add_argument("--markdown", action="store_true", help="with --report: markdown tables")
    p.add_argument("--plot", default=None, help="with --report: also write this PNG (under benchmarks/results/)")
    p.add_argument(
        "--judge",
        choices=["fresh_reward", "weighted_reward", "imputed_reward"],
        default=None,
        help="with --report: judge prompt-skipping runs by this reward instead of prompt_skipping/drawn_reward",
    )
    args = p.parse_args(argv)
    if args.report:
        runs = [r for f in args.report for r in json.loads((RESULTS_DIR / Path(f).name).read_text())["runs"]]
        for run in runs:
            if args.judge and run.get(args.judge) and run[args.judge][0] is not None:
                run["reward"] = run[args.judge]
        report(runs, args.markdown)
        if args.plot:
            plot(runs, RESULTS_DIR / Path(args.plot).name)
        return
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    tasks = args.tasks or (["echo", "sum"] if args.quick else list(TASKS))
    arms = args.arms or (["grpo", "append"] if args.quick else MAIN_ARMS)
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else list(range(8)))
    steps = args.steps or (20 if args.quick else STEPS)
    work = Path(tempfile.mkdtemp(prefix="replayrl-tasks-"))
    name = "replay_tasks" + (f"_{args.tag}" if args.tag else "")
    runs = []
    for seed in seeds:
        for task in tasks:
            for arm in arms:
                run = run_arm(task, arm, seed, steps, str(work / f"{task}-{arm}-{seed}"), args.full, args.trl_python)
                runs.append(run)
                c, s, ok, _ = to_target(run, TASKS[task][2])
                print(f"  seed {seed} {task:9s} {arm:16s}: {c}{'' if ok else '+'} completions, {s:.0f} s", flush=True)
                payload = {"steps": steps, "settings": SETTINGS, "partial": True, "runs": runs}
                write_results(name, payload, args.quick)  # after every run: an interrupted sweep keeps its runs
    text = report(runs)
    write_results(name, {"steps": steps, "settings": SETTINGS, "table": text, "runs": runs}, args.quick)
    remove_scratch(work)


if __name__ == "__main__":
    main()
