"""`training.png` of a run, drawn from its `metrics.jsonl` alone (`replayrl plot RUN_DIR` re-draws it).

The figure is drawn on a bare `matplotlib.figure.Figure` (Agg canvas), never through pyplot, so importing this
module neither needs a display nor changes the caller's matplotlib backend. matplotlib is an optional extra
(`pip install 'replayrl[plot]'`): without it, drawing raises `PlotUnavailable` (one line naming the extra) and
runs still write metrics.jsonl.
"""

from __future__ import annotations

from pathlib import Path

from replayrl.metrics import METRICS_FILE, PLOT_FILE, read_metrics, series

PLOT_EXTRA_HINT = "plotting needs matplotlib: pip install 'replayrl[plot]'"


class PlotUnavailable(ImportError):
    """matplotlib is not installed (it is the `plot` extra)."""


# (panel title, [(metric key, legend label)], note when none is logged); eval keys carry the Trainer's "eval_" prefix.
PANELS: list[tuple[str, list[tuple[str, str]], str]] = [
    ("Reward", [("reward", "train (fresh completions)"), ("eval_reward", "eval")], "no reward logged"),
    (
        "Zero-std groups (fraction of groups)",
        [("frac_reward_zero_std", "generated (before replacement)"), ("replay/frac_zero_std_trained", "trained on")],
        "not logged",
    ),
    (
        "Replay buffer",
        [("replay/buffer_size", "buffer size (groups)"), ("replay/groups_replaced", "groups replaced")],
        "not logged: replay buffer off",
    ),
    ("KL(policy || reference)", [("kl", "per token (GRPO: k3, RLOO: k1)")], "not logged: beta = 0, no KL term"),
    ("Completion length (tokens)", [("completion_length", "mean")], "not logged"),
    ("Entropy (nats per token)", [("entropy", "mean")], "not logged"),
]
# PPOTrainer runs (recognised by "objective/kl"): the stats of TRL v0.7.1's PPOTrainer.
PPO_PANELS: list[tuple[str, list[tuple[str, str]], str]] = [
    ("Reward", [("reward", "mean score of the batch"), ("eval_reward", "eval")], "no reward logged"),
    ("KL(policy || reference)", [("objective/kl", "sum over response tokens")], "not logged"),
    ("KL coefficient", [("objective/kl_coef", "beta")], "not logged"),
    ("Losses", [("ppo/loss/policy", "policy"), ("ppo/loss/value", "value (x vf_coef)")], "not logged"),
    ("Value head", [("ppo/val/vpred", "mean prediction"), ("ppo/returns/mean", "mean return")], "not logged"),
    ("Entropy (nats per token)", [("ppo/policy/entropy", "mean")], "not logged"),
]
# Keys that only a GRPO run logs (PPO runs log `reward` too, but are recognised first): they select PANELS.
GRPO_KEYS = {"reward", "frac_reward_zero_std"}
# Keys not worth a panel of their own when drawing a run of another trainer.
_BOOKKEEPING = {
    "step",
    "epoch",
    "total_flos",
    "train_loss",
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
}


def panels_for(records: list[dict]) -> list[tuple[str, list[tuple[str, str]], str]]:
    """GRPO's PANELS for a GRPO run; for any other trainer, one panel per logged metric (train and eval
    together), losses first, at most six."""
    keys = {k for r in records for k, v in r.items() if isinstance(v, (int, float)) and k not in _BOOKKEEPING}
    if "objective/kl" in keys:
        return PPO_PANELS
    if keys & GRPO_KEYS:  # not any PANELS key: other trainers log `entropy` too
        return PANELS
    names = sorted({k.removeprefix("eval_") for k in keys}, key=_panel_order)[:6]
    return [(name, [(name, "train"), (f"eval_{name}", "eval")], "not logged") for name in names]


def plot_metrics(records: list[dict], path: str | Path, title: str = "") -> Path:
    """Draw the PANELS against optimizer step into a PNG at `path`. A panel none of whose metrics the run
    logged (`kl` with beta = 0, replay metrics with the buffer off) shows a note instead of a curve."""
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise PlotUnavailable(PLOT_EXTRA_HINT) from err

    fig = Figure(figsize=(15, 8), layout="constrained")
    axes = fig.subplots(2, 3).ravel()
    for ax, (panel_title, lines, missing) in zip(axes, panels_for(records)):
        drawn = 0
        for key, label in lines:
            steps, values = series(records, key)
            if steps:
                marker = "o" if key.startswith("eval_") or len(steps) < 30 else None
                ax.plot(steps, values, label=label, marker=marker, markersize=3)
                drawn += 1
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, missing, ha="center", va="center", transform=ax.transAxes)
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path


def plot_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Re-draw `RUN_DIR/training.png` (or `output`) from `RUN_DIR/metrics.jsonl`."""
    run_dir = Path(run_dir)
    metrics = run_dir / METRICS_FILE
    if not metrics.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir} (is it the output_dir of a replayrl run?)")
    return plot_metrics(read_metrics(metrics), output or run_dir / PLOT_FILE, title=str(run_dir))


# Headline metrics of the preference trainers (DPO, reward): drawn right after the losses when a run logs them.
_HEADLINE = ("rewards/accuracies", "rewards/margins", "rewards/chosen", "accuracy", "margin")


def _panel_order(key: str) -> tuple:
    return ("loss" not in key, _HEADLINE.index(key) if key in _HEADLINE else len(_HEADLINE), key)
