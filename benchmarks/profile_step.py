"""Where replayrl's step time goes, and what candidate changes to replayrl/ would buy (measured, A/B alternating).

    python benchmarks/profile_step.py            # profiles, micro-benchmarks, end-to-end A/B (~15 min)
    python benchmarks/profile_step.py --quick    # fewer steps, repeats and rounds

1. Profiles: one worker run (`grpo_worker.py`, GRPOWithReplayBufferTrainer) under torch.profiler (op table) and one
   under cProfile (Python call tree), both over the timed steps only. Prints the top ops, replayrl's own functions
   by cumulative time, and the host-sync calls per step (`.item()`, `.tolist()`, `.cpu()`: each one a device sync on
   GPU). Full tables go to benchmarks/results/profile_<config>_{ops.txt,pstats.txt}.
2. Micro-benchmarks of candidate changes, each against the current replayrl code, alternating A/B:
   - logps: `algos.token_logps_and_entropy` as the loss pass calls it (per-row logsumexp for the log-probs, then a
     second chunked log_softmax for the entropy, on logits that require grad) vs `candidates.token_logps_and_entropy`
     (one log_softmax per row, entropy from it under no_grad); forward + backward at the benchmark vocabulary
     (~100) and at a real one (32k), with the MiB autograd saves for backward;
   - replay: storing one group the way `_after_first_pass` does (trim + copy to CPU + clone, then
     `ReplayBuffer.add` trims and clones again) vs storing it once;
   - padding: the loss pass on real generated batches vs length-sorted micro-chunks trimmed of shared padding;
   - generation: `rollout.generate_completions` (transformers `generate`) vs a minimal sampling loop, with and
     without dropping finished rows.
3. End-to-end A/B: whole training runs with the `candidates.py` prototypes patched in vs replayrl as is (larger and
   vocab32k configs), step time and peak RSS.
"""

from __future__ import annotations

import argparse
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    CONFIGS,
    RESULTS_DIR,
    median,
    prepare_assets,
    print_table,
    remove_scratch,
    run_worker,
    summarize_run,
    write_results,
)

SYNC_METHODS = ("item", "tolist", "cpu", "nonzero", "__bool__", "__int__", "__float__")


# ------------------------------------------------------------------------------------------------ profiles
def profile_run(config: str, quick: bool, work: Path) -> dict:
    cfg = CONFIGS[config]
    model_dir, data_file = prepare_assets(work, config)
    steps = cfg["quick_steps" if quick else "steps"]
    base = ["--impl", "replayrl", "--config", config, "--replay-buffer-size", str(cfg["replay_buffer_size"])]
    base += ["--model-dir", str(model_dir), "--data-file", str(data_file), "--warmup", str(cfg["warmup"])]
    base += ["--steps", str(steps)]
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    ops_path = RESULTS_DIR / f"profile_{config}_ops.txt"
    run_worker(sys.executable, [*base, "--torch-profile", str(ops_path)], work / "torch-profile.log")
    prof_path = work / "step.prof"
    result = run_worker(sys.executable, [*base, "--cprofile", str(prof_path)], work / "cprofile.log")

    stats = pstats.Stats(str(prof_path))
    buffer = io.StringIO()
    pstats.Stats(str(prof_path), stream=buffer).sort_stats("cumulative").print_stats(60)
    (RESULTS_DIR / f"profile_{config}_pstats.txt").write_text(buffer.getvalue())
    total = sum(s["step"] for s in result["steps"])
    own = []
    for (file, line, name), (_, ncalls, _, cumtime, _) in stats.stats.items():
        if "/replayrl/" in file and "/site-packages/" not in file:
            short = file.split("/replayrl/", 1)[1]
            own.append(
                {
                    "function": f"{short}:{line}({name})",
                    "calls_per_step": ncalls / steps,
                    "ms_per_step": 1000 * cumtime / steps,
                    "share": f"{100 * cumtime / total:.1f}%",
                }
            )
    own.sort(key=lambda r: -r["ms_per_step"])
    syncs = {}
    for (_file, _, name), (_, ncalls, _, _, _) in stats.stats.items():
        method = name.split("'")[1] if name.startswith("<method '") else None
        if method in SYNC_METHODS and "TensorBase" in name:
            syncs[method] = syncs.get(method, 0) + ncalls / steps
    print("\n" + "\n".join(ops_path.read_text().splitlines()[:28]))
    own_table = print_table(
        own[:25],
        ["function", "calls_per_step", "ms_per_step", "share"],
        title="\nreplayrl functions, cumulative time per step (cProfile, inflates Python)",
    )
    sync_rows = [{"method": k, "calls_per_step": v} for k, v in sorted(syncs.items(), key=lambda kv: -kv[1])]
    sync_table = print_table(sync_rows, ["method", "calls_per_step"], title="\nhost-sync tensor methods per step")
    return {
        "config": config,
        "replayrl_functions": own,
        "syncs_per_step": syncs,
        "own_table": own_table,
        "sync_table": sync_table,
        "step_s_under_cprofile": median(s["step"] for s in result["steps"]),
    }


# ------------------------------------------------------------------------------------------------ micro A/B
def ab(fn_a, fn_b, repeats: int, inner: int) -> tuple[float, float]:
    """Median seconds per call of fn_a and fn_b, alternating A/B blocks of `inner` calls."""
    fn_a(), fn_b()  # warm-up
    times = {"a": [], "b": []}
    for r in range(repeats):
        for key, fn in (("a", fn_a), ("b", fn_b)) if r % 2 == 0 else (("b", fn_b), ("a", fn_a)):
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            times[key].append((time.perf_counter() - start) / inner)
    return median(times["a"]), median(times["b"])


def logps_candidates(batch: int, width: int, vocab: int, temperature: float = 1.0):
    """Loss-pass log-probs + entropy, current `algos.token_logps_and_entropy` vs `candidates.token_logps_and_entropy`;
    both backprop logps.sum(). Returns the two closures and the largest difference of their outputs."""
    import candidates
    import torch

    from replayrl import algos

    gen = torch.Generator().manual_seed(0)
    base = torch.randn(batch, width, vocab, generator=gen)
    index = torch.randint(0, vocab, (batch, width), generator=gen)

    def run(fn):
        logits = base.clone().requires_grad_(True)
        logps, entropy = fn(logits, index, temperature, True)
        logps.sum().backward()
        return logps.detach(), entropy.detach()

    a_lp, a_ent = run(algos.token_logps_and_entropy)
    b_lp, b_ent = run(candidates.token_logps_and_entropy)
    max_diff = max(float((a_lp - b_lp).abs().max()), float((a_ent - b_ent).abs().max()))
    return lambda: run(algos.token_logps_and_entropy), lambda: run(candidates.token_logps_and_entropy), max_diff


def replay_store_candidates(rows: int, prompt_width: int, width: int):
    """Store one group as `_after_first_pass` + `ReplayBuffer.add` do (trim/cpu/clone twice) vs once."""
    import torch

    from replayrl.grpo.rollout import Rollout
    from replayrl.replay.buffer import ReplayBuffer

    gen = torch.Generator().manual_seed(0)
    group = Rollout(
        prompt_ids=torch.randint(0, 90, (rows, prompt_width), generator=gen),
        prompt_mask=torch.ones(rows, prompt_width, dtype=torch.long),
        completion_ids=torch.randint(0, 90, (rows, width), generator=gen),
        completion_mask=torch.ones(rows, width, dtype=torch.long),
        rewards=torch.rand(rows, generator=gen),
        advantages=torch.randn(rows, generator=gen),
        policy_version=torch.zeros(rows, dtype=torch.long),
        replayed=torch.zeros(rows, dtype=torch.bool),
        truncated=torch.zeros(rows, dtype=torch.bool),
        old_logps=torch.randn(rows, width, generator=gen),
        ref_logps=torch.randn(rows, width, generator=gen),
        loss_weights=torch.rand(rows, width, generator=gen),
    )
    buffer = ReplayBuffer(capacity=10**9)

    def current():
        stored = group.with_(loss_weights=None).trim().to("cpu").clone()
        buffer.add(stored, 1.0, 0)  # trims, moves and clones again

    def once():
        buffer.groups.clear()  # keep both variants' buffers small and equal
        stored = group.with_(loss_weights=None).trim().to("cpu").clone()
        buffer.groups.append(stored)

    def current_cleared():
        buffer.groups.clear()
        current()

    return current_cleared, once


def saved_for_backward_mib(fn) -> float:
    """MiB of tensors autograd saves for backward while `fn()` runs (what a forward pass pins until backward)."""
    import torch

    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0] / 2**20


def real_batches(model_dir: Path, config: str, seeds=(0, 1, 2, 3)):
    """Generated batches of the config (prompt ids/mask, completion ids/mask, one per seed) and the model."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from replayrl.generation.hf import generate_completions
    from replayrl.models.tiny import build_tokenizer, prompt_dataset

    cfg = CONFIGS[config]
    tok = build_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    gen = GenerationConfig(
        max_new_tokens=cfg["max_completion_length"],
        do_sample=True,
        temperature=1.0,
        top_k=0,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    batches = []
    for seed in seeds:
        prompts = list(prompt_dataset(cfg["batch"] // cfg["num_generations"], seed=seed)["prompt"])
        prompts = [p for p in prompts for _ in range(cfg["num_generations"])]
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        torch.manual_seed(seed)
        cids, cmask, _ = generate_completions(model, enc["input_ids"], enc["attention_mask"], gen)
        batches.append((enc["input_ids"], enc["attention_mask"], cids, cmask))
    return model, tok, gen, batches


def padding_candidates(model, batches, chunks: int):
    """Loss-pass forward + backward on each padded batch (current `_token_logps`) vs rows sorted by length, split
    into `chunks` micro-chunks, each trimmed of the padding its rows share."""
    import torch

    from replayrl import algos

    def fwd_bwd(pi, pm, ci, cm):
        logits = model(
            input_ids=torch.cat([pi, ci], 1), attention_mask=torch.cat([pm, cm], 1), logits_to_keep=ci.shape[1] + 1
        ).logits[:, :-1]
        logps, _ = algos.token_logps_and_entropy(logits, ci, 1.0, False)
        (logps * cm).sum().backward()

    def current():
        for pids, pmask, cids, cmask in batches:
            model.zero_grad()
            fwd_bwd(pids, pmask, cids, cmask)

    def bucketed():
        for pids, pmask, cids, cmask in batches:
            model.zero_grad()
            order = torch.argsort(pmask.sum(1) + cmask.sum(1))
            for rows in order.chunk(chunks):
                pm, cm = pmask[rows], cmask[rows]
                p0, c1 = int(pm.any(0).nonzero()[0]), int(cm.any(0).nonzero()[-1]) + 1
                fwd_bwd(pids[rows][:, p0:], pm[:, p0:], cids[rows][:, :c1], cm[:, :c1])

    return current, bucketed


def lean_sampler(model, pids, pmask, max_new_tokens: int, eos: int, pad: int, drop_finished: bool):
    """A minimal sampling loop (temperature 1, no top-k/top-p), optionally dropping finished rows from the batch
    and the KV cache; the prototype of a leaner `rollout.generate_completions`."""
    import torch
    from transformers import DynamicCache

    n = pids.shape[0]
    attn, pos = pmask.clone(), (pmask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(input_ids=pids, attention_mask=attn, position_ids=pos, past_key_values=cache, logits_to_keep=1)
        pos = pos[:, -1:] + 1
        result, alive = torch.full((n, max_new_tokens), pad), torch.arange(n)
        for t in range(max_new_tokens):
            token = torch.multinomial(out.logits[:, -1].float().softmax(-1), 1)
            result[alive, t] = token[:, 0]
            finished = token[:, 0] == eos
            if t == max_new_tokens - 1 or bool(finished.all()):
                break
            if drop_finished and bool(finished.any()):
                keep = (~finished).nonzero()[:, 0]
                alive, token, attn, pos = alive[keep], token[keep], attn[keep], pos[keep]
                cache.batch_select_indices(keep)
            attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], 1)
            out = model(input_ids=token, attention_mask=attn, position_ids=pos, past_key_values=cache)
            pos = pos + 1
    return result


def micro_benchmarks(quick: bool, model_dir: Path, config: str) -> list[dict]:
    import torch

    from replayrl.generation.hf import generate_completions

    torch.set_num_threads(1)
    repeats, rows = (3 if quick else 7), []

    def row(candidate, a, b, **extra):
        rows.append({"candidate": candidate, "current_ms": 1000 * a, "proposed_ms": 1000 * b, "ratio": b / a, **extra})

    for vocab in (98, 32768):
        current, proposed, diff = logps_candidates(16, 64, vocab)
        a, b = ab(current, proposed, repeats, 20 if vocab < 1000 else 1)
        saved = (saved_for_backward_mib(current), saved_for_backward_mib(proposed))
        row(
            f"algos logps fwd+bwd B16 T64 V{vocab}: one log_softmax, entropy from it under no_grad",
            a,
            b,
            saved_mib=f"{saved[0]:.0f} -> {saved[1]:.0f}",
            max_abs_diff=diff,
        )
    current, once = replay_store_candidates(8, 30, 64)
    a, b = ab(current, once, repeats, 200)
    row("store one replay group (8 rows): trim/cpu/clone once instead of twice", a, b)

    model, tok, gen, batches = real_batches(model_dir, config)
    real = sum(int(pm.sum() + cm.sum()) for pm, cm in ((b[1], b[3]) for b in batches))
    padding = 1 - real / sum(b[0].shape[0] * (b[0].shape[1] + b[2].shape[1]) for b in batches)
    for chunks in (2, 4):
        current, bucketed = padding_candidates(model, batches, chunks)
        a, b = ab(current, bucketed, repeats, 1)
        row(
            f"loss pass fwd+bwd, {config} x{len(batches)} batches ({100 * padding:.0f}% padding): "
            f"{chunks} length-sorted trimmed chunks",
            a,
            b,
        )
    model.eval()
    width = CONFIGS[config]["max_completion_length"]
    eos, pad = tok.eos_token_id, tok.pad_token_id
    alive = sum(float(b[3].float().sum()) for b in batches) / sum(b[3].shape[0] * width for b in batches)

    def hf_generate():
        for pids, pmask, _, _ in batches:
            generate_completions(model, pids, pmask, gen)

    def lean(drop_finished: bool):
        for pids, pmask, _, _ in batches:
            lean_sampler(model, pids, pmask, width, eos, pad, drop_finished)

    a, b = ab(hf_generate, lambda: lean(False), repeats, 1)
    row(f"generation, {config} x{len(batches)} batches: transformers generate -> minimal sampling loop", a, b)
    a, b = ab(hf_generate, lambda: lean(True), repeats, 1)
    row(f"generation: ... -> minimal loop that drops finished rows ({100 * alive:.0f}% of row-steps alive)", a, b)
    return rows


def end_to_end_ab(configs: list[str], quick: bool, work: Path, rounds: int) -> list[dict]:
    """Step time and peak RSS of replayrl as is vs with each prototype of `candidates.py` patched in, alternating
    the variants' order every round (fresh worker process per run, GRPOWithReplayBufferTrainer, beta 0.04)."""
    variants = {"current": [], "shared_logsoftmax": ["shared_logsoftmax"], "lean_generate": ["lean_generate"]}
    rows = []
    for config in configs:
        cfg = CONFIGS[config]
        model_dir, data_file = prepare_assets(work, config)
        base = ["--impl", "replayrl", "--config", config, "--replay-buffer-size", str(cfg["replay_buffer_size"])]
        base += ["--model-dir", str(model_dir), "--data-file", str(data_file)]
        base += ["--warmup", str(cfg["quick_warmup"]), "--steps", str(cfg["quick_steps" if quick else "steps"])]
        runs: dict[str, list[dict]] = {name: [] for name in variants}
        for r in range(rounds):
            names = list(variants) if r % 2 == 0 else list(variants)[::-1]
            for name in names:
                extra = ["--candidate", *variants[name]] if variants[name] else []
                result = run_worker(
                    sys.executable, [*base, "--seed", str(r), *extra], work / f"ab-{config}-{name}-{r}.log"
                )
                runs[name].append(summarize_run(result))
                print(f"  A/B {config} round {r} {name:18s} {runs[name][-1]['step_s']:.3f} s/step", flush=True)
        current = median(s["step_s"] for s in runs["current"])
        current_rss = median(s["peak_rss_mib"] for s in runs["current"])
        for name, summaries in runs.items():
            step = median(s["step_s"] for s in summaries)
            rss = median(s["peak_rss_mib"] for s in summaries)
            rows.append(
                {
                    "config": config,
                    "variant": name,
                    "step_s": step,
                    "ratio": step / current,
                    "generation_s": median(s.get("generation", 0.0) for s in summaries),
                    "loss_fwd_s": median(s.get("loss_fwd", 0.0) for s in summaries),
                    "backward_s": median(s.get("backward", 0.0) for s in summaries),
                    "peak_rss_mib": rss,
                    "rss_ratio": rss / current_rss,
                    "per_round_s": [s["step_s"] for s in summaries],
                }
            )
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--config", default="larger", choices=sorted(CONFIGS))
    p.add_argument("--skip-profile", action="store_true", help="skip the profiles")
    p.add_argument("--skip-ab", action="store_true", help="skip the end-to-end A/B of the candidates")
    p.add_argument("--ab-configs", nargs="+", default=["larger", "vocab32k"], choices=sorted(CONFIGS))
    p.add_argument("--rounds", type=int, default=None, help="end-to-end A/B rounds (default 3, quick 1)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="replayrl-profile-"))
    payload = {}
    if not args.skip_profile:
        payload["profile"] = profile_run(args.config, args.quick, work)
    model_dir, _ = prepare_assets(work, args.config)
    rows = micro_benchmarks(args.quick, model_dir, args.config)
    columns = ["candidate", "current_ms", "proposed_ms", "ratio", "saved_mib", "max_abs_diff"]
    payload["micro_table"] = print_table(rows, columns, title="\nmicro-benchmarks (A/B, medians)")
    payload["micro"] = rows
    if not args.skip_ab:
        ab_rows = end_to_end_ab(args.ab_configs, args.quick, work, args.rounds or (1 if args.quick else 3))
        columns = ["config", "variant", "step_s", "ratio", "generation_s", "loss_fwd_s", "backward_s", "peak_rss_mib"]
        payload["ab_table"] = print_table(
            ab_rows, [*columns, "rss_ratio"], title="\nend-to-end A/B (ratio: vs current)"
        )
        payload["ab"] = ab_rows
    write_results(f"profile_{args.config}", payload, quick=args.quick)
    remove_scratch(work)


if __name__ == "__main__":
    main()
