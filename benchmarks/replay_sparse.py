"""Does replay pay on a sparse task? Steps (= completions) to a target reward from a random-init tiny policy, plain
GRPO against replay variants, several seeds, with the `replay/*` diagnostics of every run.

    python benchmarks/replay_sparse.py                                  # every arm, seeds 0-4
    python benchmarks/replay_sparse.py --arms grpo replay --seeds 0 1 --tag a   # a slice -> replay_sparse_a.json
    python benchmarks/replay_sparse.py --report replay_sparse_a.json replay_sparse_b.json   # one table from slices
    python benchmarks/replay_sparse.py --quick                          # smoke run: 1 seed, 2 arms, 15 steps
    python benchmarks/replay_sparse.py --arms trl_grpo --trl-python PATH/.venv-trl/bin/python --tag trl  # TRL's GRPO

Task `echo` (held out: nothing in replayrl was tuned on it): prompts are the 80 training prompts of the addition
task ("7+5="); the reward is 1.0 when the completion's first character is the prompt's first character, else 0.0.
The policy is a random-init tiny Qwen2 (hidden 64, 2 layers, ~100-token character vocabulary), so a completion is
right ~1% of the time at first and ~94% of the first groups of G=8 are all-zero. Every arm generates the same 128
completions per step (16 prompts x 8) unless it uses dynamic sampling, which generates more and is charged for it:
the x axis is completions generated. "to R" = completions until the moving average (10 steps) of the training
reward first reaches R; a run that never does counts as the run's length in the median and is reported as censored.

Arm `trl_grpo` is TRL's GRPOTrainer on the same task: the same random-init model (saved to disk, loaded in fp32),
the same prompts and reward function, and the `grpo` arm's settings mapped field by field to TRL's GRPOConfig
(`sparse_trl_worker.trl_settings`), run as a worker process in TRL's virtualenv (`vs_trl.py` creates it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, median, print_table, remove_scratch, write_results  # noqa: E402
from sample_efficiency import _first_reaching, smooth  # noqa: E402

WINDOW = 10
SETTINGS = dict(
    per_device_train_batch_size=128,
    num_generations=8,
    max_prompt_length=16,
    max_completion_length=2,
    temperature=1.0,
    top_k=50,  # what the documented runs sampled with: `top_k=None` reached generate as 50 until it was fixed
    learning_rate=3e-3,
    lr_scheduler_type="constant",
    beta=0.0,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    disable_tqdm=True,
    use_cpu=True,
)
# arm -> (trainer, config overrides). Replay arms spell out every knob whose default changed, so that a result file
# names what ran: SEED is TRL's replay semantics (no age or reuse bound, PPO ratio against the behaviour policy), which
# was replayrl's default before this benchmark; "default" is GRPOWithReplayBufferConfig's defaults as they are now.
SEED = {"replay_max_age": None, "replay_max_reuse": None, "replay_importance_cap": None}
ARMS: dict[str, tuple[str, dict]] = {
    "grpo": ("grpo", {}),
    "replay": ("replay", SEED),
    "replay_fresh": ("replay", {**SEED, "replay_max_age": 4, "replay_max_reuse": 2}),
    "replay_tis": ("replay", {**SEED, "replay_importance_cap": 2.0}),
    "mix": ("replay", {**SEED, "replay_strategy": "mix"}),
    "mix_tis": ("replay", {**SEED, "replay_strategy": "mix", "replay_importance_cap": 2.0}),
    "fresh_tis": ("replay", {"replay_max_age": 4, "replay_max_reuse": 2, "replay_importance_cap": 2.0}),
    "tis_age10": ("replay", {**SEED, "replay_max_age": 10, "replay_importance_cap": 2.0}),
    "mix_group": ("replay", {**SEED, "replay_strategy": "mix_then_group"}),
    "mix_group_tis10": (
        "replay",
        {**SEED, "replay_strategy": "mix_then_group", "replay_max_age": 10, "replay_importance_cap": 2.0},
    ),
    "default": ("replay", {}),
    "dynamic": ("grpo", {"dynamic_sampling": True, "dynamic_sampling_max_rounds": 3}),
    "dynamic_replay": ("replay", {"dynamic_sampling": True, "dynamic_sampling_max_rounds": 3}),
    # the arms above sample from the 50 likeliest tokens (see SETTINGS); these two sample from the full vocabulary,
    # like trl_grpo_topk0.
    "grpo_topk0": ("grpo", {"top_k": 0}),
    "default_topk0": ("replay", {"top_k": 0}),
    "trl_grpo": ("trl", {}),  # TRL's GRPOTrainer with the `grpo` arm's settings (sparse_trl_worker.py)
    "trl_grpo_topk0": ("trl", {"top_k": 0}),  # the same without top-k filtering (the grpo arm samples top-50)
}
DIAGNOSTICS = (
    "frac_reward_zero_std",
    "grad_norm",
    "replay/frac_zero_std_trained",
    "replay/groups_replaced",
    "replay/rows_mixed",
    "replay/clipped_token_frac",
    "replay/importance_ratio_abs_log_mean",
    "replay/age_mean",
    "replay/reuse_mean",
    "replay/distinct_frac",
    "replay/loss_weight_share",
    "replay/adv_weight_share",
    "replay/informative_weight_frac",
    "dynamic_sampling/rounds",
    "dynamic_sampling/groups_discarded",
)


def echo_reward(completions, prompts, **kwargs) -> list[float]:
    """1.0 when the completion starts with the prompt's first character."""
    return [float(str(c)[:1] == str(p)[:1]) for c, p in zip(completions, prompts)]


def run_arm(arm: str, seed: int, steps: int, output_dir: str, trl_python: str | None = None) -> dict:
    if ARMS[arm][0] == "trl":
        return run_trl_arm(arm, seed, steps, output_dir, trl_python)
    from transformers import PrinterCallback

    from replayrl import GRPOConfig, GRPOTrainer, GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
    from replayrl.models.tiny import build_tiny_model, build_tokenizer
    from replayrl.tasks.addition import task_datasets

    kind, overrides = ARMS[arm]
    settings = {**SETTINGS, **overrides, "max_steps": steps, "seed": seed, "output_dir": output_dir}
    if kind == "replay":
        config, cls = GRPOWithReplayBufferConfig(**settings), GRPOWithReplayBufferTrainer
    else:
        config, cls = GRPOConfig(**settings), GRPOTrainer
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    train, _ = task_datasets(seed)
    trainer = cls(model=model, reward_funcs=[echo_reward], args=config, train_dataset=train, processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    per_step = config.per_device_train_batch_size
    generated = [h.get("dynamic_sampling/completions", per_step) for h in logs]
    return {
        "arm": arm,
        "seed": seed,
        "reward": [h["reward"] for h in logs],
        "completions": [sum(generated[: i + 1]) for i in range(len(generated))],
        "diagnostics": {k: [h.get(k) for h in logs] for k in DIAGNOSTICS},
        "seconds": time.perf_counter() - start,
    }


def run_trl_arm(arm: str, seed: int, steps: int, output_dir: str, trl_python: str | None) -> dict:
    """TRL's GRPOTrainer in its own virtualenv, on the model and prompts of `run_arm` saved to `output_dir`."""
    from replayrl.models.tiny import build_tiny_model, build_tokenizer
    from replayrl.tasks.addition import task_datasets

    work = Path(output_dir)
    model_dir, data_file = work / "model", work / "prompts.jsonl"
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data_file.write_text("".join(json.dumps(r) + "\n" for r in task_datasets(seed)[0].to_list()))
    if trl_python is None:
        from vs_trl import ensure_trl_venv

        trl_python = str(ensure_trl_venv())
    cmd = [trl_python, str(Path(__file__).resolve().parent / "sparse_trl_worker.py"), "--model-dir", str(model_dir)]
    cmd += ["--data-file", str(data_file), "--seed", str(seed), "--steps", str(steps)]
    cmd += ["--output-dir", str(work / "out"), "--overrides", json.dumps(ARMS[arm][1])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.update(TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # the TRL venv must not see replayrl's environment
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"TRL worker failed (rc={proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    per_step = SETTINGS["per_device_train_batch_size"]
    result["completions"] = [per_step * (i + 1) for i in range(len(result["reward"]))]
    return {"arm": arm, "seed": seed, **result}


def completions_to(run: dict, target: float) -> tuple[float, bool]:
    """(completions generated when the smoothed reward first reaches `target`, reached?)."""
    step = _first_reaching(smooth(run["reward"], WINDOW), target)
    return (run["completions"][step - 1], True) if step else (run["completions"][-1], False)


def _nanmean(values) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def summarize(runs: list[dict], targets: list[float]) -> list[dict]:
    rows = []
    for arm in ARMS:
        arm_runs = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
        if not arm_runs:
            continue
        row = {"arm": arm, "seeds": len(arm_runs)}
        for t in targets:
            hits = [completions_to(r, t) for r in arm_runs]
            row[f"to_{t}"] = median(c for c, _ in hits)
            row[f"to_{t}_per_seed"] = " ".join(f"{c / 1000:.1f}k" + ("" if ok else "+") for c, ok in hits)
        row["reward_last_20"] = median(_nanmean(r["reward"][-20:]) for r in arm_runs)
        for key in DIAGNOSTICS:
            values = [_nanmean(r["diagnostics"][key]) for r in arm_runs]
            if any(v == v for v in values):  # not all NaN
                row[key] = median(values)
        rows.append(row)
    return rows


def report(runs: list[dict], targets: list[float]) -> str:
    rows = summarize(runs, targets)
    head = ["arm", "seeds"] + [c for t in targets for c in (f"to_{t}", f"to_{t}_per_seed")] + ["reward_last_20"]
    text = print_table(rows, head, title="\ncompletions to target (median over seeds; '+' = not reached)")
    diag = [k for k in DIAGNOSTICS if any(k in r for r in rows)]
    text += "\n" + print_table(rows, ["arm", *diag], title="\ndiagnostics: run means, median over seeds")
    return text


def markdown(runs: list[dict], targets: list[float]) -> str:
    """The summary as a markdown table (for docs/replay.md)."""
    rows = summarize(runs, targets)
    cols = ["arm", "seeds"] + [c for t in targets for c in (f"to_{t}", f"to_{t}_per_seed")] + ["reward_last_20"]
    cols += [k for k in ("replay/adv_weight_share", "replay/clipped_token_frac", "replay/age_mean") if k in rows[0]]
    number = lambda v: f"{v:,.0f}" if v >= 100 else (str(v) if isinstance(v, int) else f"{v:.2f}")  # noqa: E731
    fmt = {float: number, int: number}
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt.get(type(r.get(c)), str)(r.get(c, "")) for c in cols) + " |")
    text = "\n".join(lines)
    print(text)
    return text


def plot(runs: list[dict], path: Path) -> None:
    """Median (over seeds) smoothed training reward against completions generated, one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    plotted = 0
    for arm in ARMS:
        arm_runs = [r for r in runs if r["arm"] == arm]
        if not arm_runs:
            continue
        n = min(len(r["reward"]) for r in arm_runs)
        curves = [smooth(r["reward"], WINDOW)[:n] for r in arm_runs]
        x = [median(r["completions"][i] for r in arm_runs) for i in range(n)]
        style = "-" if plotted < 10 else "--"  # the default colour cycle has 10 colours
        y = [median(c[i] for c in curves) for i in range(n)]
        ax.plot(x, y, style, label=f"{arm} ({len(arm_runs)} seeds)")
        plotted += 1
    ax.set_xlabel("completions generated")
    ax.set_ylabel(f"reward, {WINDOW}-step moving average (median)")
    ax.set_xlim(0, min(max(r["completions"][-1] for r in runs), 200 * SETTINGS["per_device_train_batch_size"]))
    ax.set_title("sparse task `echo` from a random-init tiny Qwen2", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 1 seed, grpo + replay, 15 steps")
    p.add_argument("--arms", nargs="+", default=None, choices=list(ARMS), help="default: all")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 3 4 (quick: 0)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 200; quick 15)")
    p.add_argument("--targets", type=float, nargs="+", default=[0.3, 0.5])
    p.add_argument("--tag", default=None, help="write replay_sparse_<tag>.json (to run slices in parallel)")
    p.add_argument("--trl-python", default=None, help="trl_grpo arm: TRL's interpreter (default: create .venv-trl)")
    p.add_argument("--report", nargs="+", default=None, help="print one table from these result files and exit")
    p.add_argument("--markdown", action="store_true", help="with --report: a markdown table")
    p.add_argument("--plot", default=None, help="with --report: also write this PNG (under benchmarks/results/)")
    args = p.parse_args(argv)
    if args.report:
        runs = [r for f in args.report for r in json.loads((RESULTS_DIR / Path(f).name).read_text())["runs"]]
        markdown(runs, args.targets) if args.markdown else report(runs, args.targets)
        if args.plot:
            plot(runs, RESULTS_DIR / Path(args.plot).name)
        return
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    arms = args.arms or (["grpo", "replay"] if args.quick else list(ARMS))
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2, 3, 4])
    steps = args.steps or (15 if args.quick else 200)
    work = Path(tempfile.mkdtemp(prefix="replayrl-sparse-"))
    runs = []
    name = "replay_sparse" + (f"_{args.tag}" if args.tag else "")
    for seed in seeds:
        for arm in arms:
            run = run_arm(arm, seed, steps, str(work / f"{arm}-{seed}"), args.trl_python)
            runs.append(run)
            hit, ok = completions_to(run, 0.5)
            print(f"  seed {seed} {arm:12s}: to 0.5 {hit:.0f}{'' if ok else '+'} ({run['seconds']:.0f} s)", flush=True)
            partial = {"steps": steps, "seeds": seeds, "settings": SETTINGS, "partial": True, "runs": runs}
            write_results(name, partial, args.quick)  # after every run, so an interrupted sweep keeps its runs
    text = report(runs, args.targets)
    write_results(name, {"steps": steps, "seeds": seeds, "settings": SETTINGS, "table": text, "runs": runs}, args.quick)
    remove_scratch(work)


if __name__ == "__main__":
    main()
