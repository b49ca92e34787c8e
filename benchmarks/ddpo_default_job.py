"""Does the built-in `replayrl ddpo` job (no arguments) raise its reward? Several seeds, plus a paired control.

For each seed it runs the built-in job exactly as `replayrl ddpo --seed S` would (same defaults, same pipeline),
and a control run with the same seed whose optimizer learning rate is 0: it samples the very same noise, so the
gap "trained - control" per epoch is what DDPO's updates did, with the sampling noise paired out. Prints the
reward per epoch (median over seeds) and the first-vs-last-epoch comparison.

    python benchmarks/ddpo_default_job.py --seeds 0 1 2 --out benchmarks/results/ddpo_default_job.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time


def run_job(
    seed: int, extra: list[str], control: bool, model_seed: int | None = None, vae_norm_groups: int | None = None
) -> list[float]:
    """reward_mean per epoch of the built-in job (learning rate 0 when ``control``; the tiny model's weights from
    ``model_seed`` instead of the job's when given)."""
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
    rewards = []
    torch.set_num_threads(1)
    for epoch in range(config.num_epochs):
        trainer.step(epoch, trainer.global_step)
        rewards.append(trainer._epoch_stats["reward_mean"])
    return rewards


def _row(name: str, values: list[float]) -> str:
    return f"{name:>18} " + " ".join(f"{v:7.4f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--model-seed", type=int, default=None, help="tiny model weights (default: the job's)")
    parser.add_argument("--vae-norm-groups", type=int, default=None, help="tiny VAE GroupNorm groups (1, 2, 4, 8)")
    parser.add_argument("--no-control", action="store_true", help="skip the learning-rate-0 control runs")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args, extra = parser.parse_known_args()  # anything else is passed to `replayrl ddpo`
    results = []
    for seed in args.seeds:
        start = time.perf_counter()
        trained = run_job(seed, extra, control=False, model_seed=args.model_seed, vae_norm_groups=args.vae_norm_groups)
        control = (
            None
            if args.no_control
            else run_job(seed, extra, control=True, model_seed=args.model_seed, vae_norm_groups=args.vae_norm_groups)
        )
        results.append({"seed": seed, "trained": trained, "control": control, "seconds": time.perf_counter() - start})
        print(_row(f"seed {seed} trained", trained), flush=True)
        if control:
            print(_row(f"seed {seed} control", control), flush=True)
    epochs = len(results[0]["trained"])
    median = [statistics.median(r["trained"][e] for r in results) for e in range(epochs)]
    print(_row("median trained", median))
    if not args.no_control:
        gaps = [statistics.median(r["trained"][e] - r["control"][e] for r in results) for e in range(epochs)]
        print(_row("median gap", gaps))
    rises = sum(r["trained"][-1] > r["trained"][0] for r in results)
    print(
        f"first -> last epoch (median over {len(results)} seeds): {median[0]:.4f} -> {median[-1]:.4f}; "
        f"rose in {rises}/{len(results)} seeds"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "seeds": args.seeds,
                    "model_seed": args.model_seed,
                    "vae_norm_groups": args.vae_norm_groups,
                    "extra": extra,
                    "results": results,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
