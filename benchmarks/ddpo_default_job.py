"""Does the built-in `replayrl ddpo` job (no arguments) raise its reward? Several seeds, plus a paired control.

For each seed it runs the built-in job exactly as `replayrl ddpo --seed S` would (same defaults, same pipeline),
and a control run with the same seed whose optimizer learning rate is 0: it samples the very same noise, so the
gap "trained - control" per epoch is what DDPO's updates did, with the sampling noise paired out. Prints the
reward per epoch (median over seeds), the gap to the control, and per seed whether the last epoch beats both the
first epoch and the control by more than twice the per-epoch noise (reward std / sqrt(images per epoch)).

    python benchmarks/ddpo_default_job.py --seeds 0 1 2 3 4 --out benchmarks/results/ddpo_default_job.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time


def run_job(
    seed: int, extra: list[str], control: bool, model_seed: int | None = None, vae_norm_groups: int | None = None
) -> dict[str, list[float]]:
    """``{"reward_mean": [...], "reward_std": [...]}`` per epoch of the built-in job (learning rate 0 when
    ``control``; the tiny model's weights from ``model_seed`` instead of the job's when given)."""
    import torch

    from replayrl.cli import ddpo
    from replayrl.cli.ddpo import build_trainer, parse_args

    if model_seed is not None:
        ddpo.BUILTIN_MODEL_SEED = model_seed
    if vae_norm_groups is not None:
        ddpo.BUILTIN_VAE_NORM_GROUPS = vae_norm_groups

    args, config = parse_args(["--seed", str(seed), "--logdir", tempfile.mkdtemp(), "--save_freq", "0", *extra])
    trainer = build_trainer(args, config)
    if control:
        for group in trainer.optimizer.param_groups:
            group["lr"] = 0.0
    out = {"reward_mean": [], "reward_std": []}
    torch.set_num_threads(1)
    for epoch in range(config.num_epochs):
        trainer.step(epoch, trainer.global_step)
        for key in out:
            out[key].append(trainer._epoch_stats[key])
    out["images_per_epoch"] = config.sample_batch_size * config.sample_num_batches_per_epoch
    return out


def _row(name: str, values: list[float]) -> str:
    return f"{name:>18} " + " ".join(f"{v:7.4f}" for v in values)


def verdict(result: dict) -> dict:
    """Per seed: first/last epoch, gap to the control in the last epoch, the per-epoch noise (control's mean reward
    std / sqrt(images per epoch)), and whether the last epoch beats the first and the control by > 2 noise."""
    trained, control = result["trained"], result["control"]
    first, last = trained["reward_mean"][0], trained["reward_mean"][-1]
    noise = statistics.mean(control["reward_std"]) / control["images_per_epoch"] ** 0.5
    gap = last - control["reward_mean"][-1]
    return {
        "first": first,
        "last": last,
        "gap_last": gap,
        "noise": noise,
        "rose": last - first > 2 * noise and gap > 2 * noise,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--model-seed", type=int, default=None, help="tiny model weights (default: the job's)")
    parser.add_argument("--vae-norm-groups", type=int, default=None, help="tiny VAE GroupNorm groups (1, 2, 4, 8)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--no-control", action="store_true", help="skip the lr-0 control (quick screening)")
    args, extra = parser.parse_known_args()  # anything else is passed to `replayrl ddpo`
    results = []
    model = dict(model_seed=args.model_seed, vae_norm_groups=args.vae_norm_groups)
    for seed in args.seeds:
        start = time.perf_counter()
        trained = run_job(seed, extra, control=False, **model)
        seconds = time.perf_counter() - start
        rewards = trained["reward_mean"]
        dip = min(r - rewards[0] for r in rewards)
        if args.no_control:
            print(f"seed {seed}: {rewards[0]:.4f} -> {rewards[-1]:.4f}, dip {dip:+.4f} ({seconds:.0f} s)", flush=True)
            print(_row("trained", rewards), flush=True)
            continue
        control = run_job(seed, extra, control=True, **model)
        result = {"seed": seed, "trained": trained, "control": control, "seconds_trained": seconds}
        result["verdict"] = verdict(result)
        result["verdict"]["dip"] = dip
        results.append(result)
        v = result["verdict"]
        print(
            f"seed {seed}: {v['first']:.4f} -> {v['last']:.4f}, gap to control {v['gap_last']:+.4f}, "
            f"per-epoch noise {v['noise']:.4f}, dip {dip:+.4f}, rose: {v['rose']} ({seconds:.0f} s)",
            flush=True,
        )
    if args.no_control:
        return
    epochs = len(results[0]["trained"]["reward_mean"])
    median = [statistics.median(r["trained"]["reward_mean"][e] for r in results) for e in range(epochs)]
    gaps = [
        statistics.median(r["trained"]["reward_mean"][e] - r["control"]["reward_mean"][e] for r in results)
        for e in range(epochs)
    ]
    print(_row("median trained", median))
    print(_row("median gap", gaps))
    rises = sum(r["verdict"]["rose"] for r in results)
    print(
        f"first -> last epoch (median over {len(results)} seeds): {median[0]:.4f} -> {median[-1]:.4f}; "
        f"rose (last > first and > control, by > 2 noise) in {rises}/{len(results)} seeds"
    )
    if args.out:
        with open(args.out, "w") as f:
            summary = {"median_trained": median, "median_gap": gaps, "rose": rises}
            json.dump({"seeds": args.seeds, **model, "extra": extra, "summary": summary, "results": results}, f)


if __name__ == "__main__":
    main()
