"""Memory of a GRPO step on a Qwen2.5-VL-shaped model with 448x448 images: replayrl vs TRL 1.16, and what
replayrl's replay buffer stores of the images.

    python benchmarks/vlm_scale.py [--rounds 2] [--trl-python PATH] [--quick] [--logs DIR] [--output NAME]

The model (`vlm_assets.py`): Qwen2.5-VL-3B's vision tower (hidden 1280, 16 heads, MLP 3420, patch 14, spatial merge
2, window 112) with fewer blocks, the 151,936-token vocabulary, and a reduced language body; on a CPU 2 vision blocks
(one window-attention, one full-attention) and `scale.py`'s CPU body (hidden 256, 2 layers), on a GPU 8 blocks and
Qwen2-0.5B's body. Seeded random weights in bf16, saved once; every prompt has its own 448x448 image (1,024 patches,
256 image tokens). Runs `scale_worker.py --trainer grpo_vlm` (GRPO, beta 0, transformers generate, the processor
without its video part on both sides: torchvision has no CPU build here) in a fresh process per run, sides
alternating, then `grpo_vlm_replay` (replayrl's GRPOWithReplayBufferTrainer, 64-group buffer; no TRL peer, its
ratios are against replayrl's grpo_vlm). Figures are medians over rounds: seconds per optimizer step, the memory
`train()` uses above its start (peak RSS on a CPU, see `scale_worker.py`), the bytes the vision tower's forward
passes with gradients save for backward (`vlm_assets.VisionActivations`, per pass), and the replay buffer's stored
image bytes per group (`VisionInputs.nbytes`). First, the vision tower alone at 1, 2 and 4 blocks on one image
(`vlm_assets.tower_saved_mib`): its saved bytes per block, and extrapolated to Qwen2.5-VL's 32 blocks.

The TRL virtualenv needs pillow (TRL's VLM path decodes PIL images); this script installs it there when missing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vlm_assets  # noqa: E402
from common import median, print_table, ratio, remove_scratch, write_results  # noqa: E402
from scale import TRL_PYTHON, run_worker, side_figures  # noqa: E402

# (gpu, cpu) worker settings: one image per prompt, `num_generations` rows per image.
RUNS = {
    "gpu": {"batch": 16, "num_generations": 8, "max_completion_length": 128},
    "cpu": {"batch": 4, "num_generations": 4, "max_completion_length": 16},
}
TIMING = {"gpu": dict(warmup=2, steps=5), "cpu": dict(warmup=1, steps=1), "quick": dict(warmup=1, steps=1)}


def ensure_pillow(python: str) -> None:
    if subprocess.run([python, "-c", "import PIL"], capture_output=True).returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "pillow"], check=True)


def vision_figures(results: list[dict]) -> dict:
    """Medians over rounds: the largest saved-activation pass of the vision tower, and the buffer's image bytes."""
    out = {"vision_saved_mib": median(max(p["saved_mib"] for p in r["vision_passes"]) for r in results)}
    out["vision_patches"] = median(max(p["patches"] for p in r["vision_passes"]) for r in results)
    stored = [m for r in results for m in r.get("buffer_image_mib", [])]
    if stored:
        out["buffer_mib_per_group"] = median(stored)
        out["buffer_groups"] = median(r["buffer_groups"] for r in results)
    return out


def tower_figures() -> dict:
    """The vision tower alone at 1, 2 and 4 blocks on one image: MiB saved per block, the rest, and at 32 blocks."""
    tower = vlm_assets.tower_saved_mib()
    per_block = (tower[4] - tower[2]) / 2
    fixed = tower[2] - 2 * per_block
    out = {"by_depth": tower, "per_block": per_block, "fixed": fixed, "depth_32": fixed + 32 * per_block}
    print(f"vision tower alone, one 448x448 image, saved for backward: {tower} MiB by depth; {per_block:.1f} MiB a "
          f"block + {fixed:.1f}; at Qwen2.5-VL's 32 blocks {out['depth_32']:.0f} MiB", flush=True)  # fmt: skip
    return out


def summarize(trainer: str, per_side: dict[str, list[dict]], rows: list[dict]) -> dict:
    """Both sides' medians and replayrl / peer ratios; the peer is TRL, or for grpo_vlm_replay replayrl's grpo_vlm."""
    row: dict = {"trainer": trainer, "peer": "trl"}
    for impl, results in per_side.items():
        row.update({f"{impl}_{k}": v for k, v in {**side_figures(results), **vision_figures(results)}.items()})
    peer, side = row, "trl"
    if "trl" not in per_side:
        peer, side, row["peer"] = next(r for r in rows if r["trainer"] == "grpo_vlm"), "replayrl", "replayrl grpo_vlm"
    for key in ("step_s", "mem_mib", "vision_saved_mib"):
        row[f"{key}_ratio"] = ratio(row[f"replayrl_{key}"], peer.get(f"{side}_{key}", float("nan")))
    return row


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="runs per side, alternating")
    p.add_argument("--trl-python", default=TRL_PYTHON)
    p.add_argument("--quick", action="store_true", help="smoke run: 1 warm-up + 1 step, 1 round")
    p.add_argument("--output", help="results name under benchmarks/results (default vlm_scale_<device>)")
    p.add_argument("--logs", type=Path, help="keep the worker logs in this folder (default: the scratch folder)")
    args = p.parse_args(argv)
    import torch

    device = "gpu" if torch.cuda.is_available() else "cpu"
    rounds = 1 if args.quick else args.rounds
    settings = {**RUNS[device], **TIMING["quick" if args.quick else device]}
    ensure_pillow(args.trl_python)
    work = Path(tempfile.mkdtemp(prefix="replayrl-vlm-scale-"))
    logs = args.logs or work
    logs.mkdir(parents=True, exist_ok=True)
    payload_tower = tower_figures()
    model_dir, data_dir = vlm_assets.make_assets(work, vlm_assets.SHAPES[device])
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    python = {"replayrl": sys.executable, "trl": args.trl_python}
    rows, runs = [], []
    payload = {"device": device, "shape": vlm_assets.SHAPES[device], "vision": vlm_assets.VISION, "image": 448}
    payload.update(
        tower_saved_mib=payload_tower,
        vocab_size=vlm_assets.VOCAB,
        rounds=rounds,
        settings=settings,
        rows=rows,
        runs=runs,
    )
    for trainer, sides in (("grpo_vlm", ["replayrl", "trl"]), ("grpo_vlm_replay", ["replayrl"])):
        per_side: dict[str, list[dict]] = {impl: [] for impl in sides}
        for r in range(rounds):
            for impl in sides if r % 2 == 0 else sides[::-1]:
                worker = ["--impl", impl, "--trainer", trainer, "--model-dir", str(model_dir)]
                result = run_worker(python[impl], [*worker, "--data-file", str(data_dir), *flags],
                                    logs / f"{trainer}-{impl}-{r}.log")  # fmt: skip
                per_side[impl].append(result)
                runs.append(result)
                passes = result["vision_passes"]
                print(f"  {trainer} round {r} {impl:8s} {median(result['steps']):.2f} s/step, working set "
                      f"{result['working_set_mib']:.0f} MiB, vision passes {passes}", flush=True)  # fmt: skip
        rows.append(summarize(trainer, per_side, rows))
        columns = ["trainer", "peer", "replayrl_step_s", "trl_step_s", "step_s_ratio", "replayrl_mem_mib"]
        columns += ["trl_mem_mib", "mem_mib_ratio", "replayrl_vision_saved_mib", "trl_vision_saved_mib"]
        columns += ["vision_saved_mib_ratio", "replayrl_buffer_mib_per_group"]
        title = f"\nGRPO on a Qwen2.5-VL-shaped model, 448x448 images ({device}; ratios replayrl / peer)"
        payload["table"] = print_table(rows, columns, title=title)
        write_results(args.output or f"vlm_scale_{device}", payload, args.quick)
    remove_scratch(work)


if __name__ == "__main__":
    main()
