"""torch.profiler for `scale_worker.py --profile`: one optimizer step after the timed ones, and for GRPO one standalone
generation with each library's own generation path on the same prompts.

What a reader of a GPU run needs at once (the GRPO step 1.22x TRL's on an H200, almost all of it `generate`): the
top ops by self device time and by self CPU time, the host-device syncs (`aten::item` / `aten::_local_scalar_dense`,
`cudaStreamSynchronize` / `cudaDeviceSynchronize` / `cudaEventSynchronize`, `cudaMemcpyAsync`, and device-side
`Memcpy DtoH` copies) and the kernel launches (`cudaLaunchKernel`, `cuLaunchKernel`, ...), per decode step for a
generation. Works on a CPU too (CPU activity only: the device columns and launches are then zero).

Imports torch lazily and never replayrl or TRL: it runs inside both virtualenvs.
"""

from __future__ import annotations

import json
import time

SYNC_OPS = (
    "aten::item",
    "aten::_local_scalar_dense",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpyAsync",
    "cudaMemcpy",
)
TOP = 25


def start_profiler(cuda: bool):
    """A started `torch.profiler.profile` over CPU activity, plus CUDA when there is a GPU."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if cuda:
        torch.cuda.synchronize()
    prof = profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])])
    prof.start()
    return prof


def stop_profiler(prof, cuda: bool) -> None:
    import torch

    if cuda:
        torch.cuda.synchronize()
    prof.stop()


def summarize(prof, label: str, wall_s: float, decode_steps: int | None = None) -> tuple[dict, str]:
    """(summary dict, text report with the two top-25 tables) of a stopped profiler. `decode_steps`: also report the
    counts per decode step (a generation of that many new tokens)."""
    events = prof.key_averages()
    syncs = {name: 0 for name in SYNC_OPS}
    launches: dict[str, int] = {}
    kernels = d2h = 0
    for e in events:
        if e.key in syncs:
            syncs[e.key] += e.count
        if "LaunchKernel" in e.key:
            launches[e.key] = launches.get(e.key, 0) + e.count
        if e.key.startswith("Memcpy DtoH"):
            d2h += e.count
        elif _on_device(e) and not e.key.startswith(("Memcpy", "Memset")):
            kernels += e.count
    sorts = ["self_cpu_time_total"]
    if any(e.self_device_time_total for e in events):  # none on a CPU-only run: no device table
        sorts.insert(0, "self_device_time_total")
    summary = {"label": label, "wall_s": wall_s, "launches": sum(launches.values()), "launch_calls": launches}
    summary.update(kernels=kernels, d2h_copies=d2h, syncs=syncs)
    summary.update(top_device_ms=_top(events, sorts[0]) if len(sorts) == 2 else [])
    summary["top_cpu_ms"] = _top(events, "self_cpu_time_total")
    if decode_steps:
        per = {"launches": summary["launches"], "kernels": kernels, "d2h_copies": d2h, **syncs}
        summary["decode_steps"] = decode_steps
        summary["per_decode_step"] = {k: round(v / decode_steps, 2) for k, v in per.items()}
    text = [f"== {label}: wall {wall_s:.3f} s (under the profiler) ==", "summary " + json.dumps(summary)]
    for sort in sorts:
        text += [f"-- top {TOP} by {sort} --", events.table(sort_by=sort, row_limit=TOP, max_name_column_width=70)]
    return summary, "\n".join(text) + "\n"


def _top(events, attr: str, n: int = 5) -> list:
    """[name, self ms, calls] of the `n` ops with the most `attr` (microseconds)."""
    ranked = sorted(events, key=lambda e: -getattr(e, attr))[:n]
    return [[e.key, round(getattr(e, attr) / 1000, 3), e.count] for e in ranked]


def _on_device(event) -> bool:
    return "CUDA" in str(getattr(event, "device_type", ""))


def profile_callback(at: int, cuda: bool, parts: dict):
    """A TrainerCallback profiling optimizer step `at + 1` (from the end of step `at` to its own end); puts
    (summary, text) into `parts["step"]`. Add it after the callbacks that time the steps."""
    from transformers import TrainerCallback

    class StepProfile(TrainerCallback):
        prof = None

        def on_step_end(self, args, state, control, **kwargs):
            try:  # a profiler failure (no CUPTI, ...) is reported, and must not cost the run's timings
                if state.global_step == at:
                    self.prof, self.start = start_profiler(cuda), time.perf_counter()
                elif state.global_step == at + 1 and self.prof is not None:
                    stop_profiler(self.prof, cuda)
                    parts["step"] = summarize(self.prof, f"optimizer step {at + 1}", time.perf_counter() - self.start)
            except Exception as e:  # noqa: BLE001
                self.prof, parts["step"] = None, failed(e)

    return StepProfile()


def failed(error: Exception) -> tuple[dict, str]:
    """(summary, text) of a part whose profile failed."""
    return {"error": repr(error)}, f"== profile failed: {error!r} ==\n"


def generation_profile(trainer, impl: str, prompts: list[str], cuda: bool) -> tuple[dict, str]:
    """Time two generations of `prompts` with the library's own path (replayrl: `trainer.generator.generate`, the
    backend a GRPO step calls; TRL: `trainer._generate_single_turn`, with `trainer.generation_config`), then profile
    a third. The model is put in train mode, as inside a step: replayrl's backend samples in eval mode
    (`generation.hf.sampling_mode`), TRL's in the mode the model is in."""
    import torch

    tok = trainer.processing_class
    ids = [tok(p)["input_ids"] for p in prompts]
    generate, config = _generator(trainer, impl, ids, tok.pad_token_id, torch)
    trainer.model.train()
    walls = []
    for _ in range(2):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        width = generate()
        if cuda:
            torch.cuda.synchronize()
        walls.append(round(time.perf_counter() - start, 4))
    prof = start_profiler(cuda)
    start = time.perf_counter()
    generate()
    stop_profiler(prof, cuda)
    label = f"standalone generation ({impl}): {len(ids)} rows x {width} new tokens"
    summary, text = summarize(prof, label, time.perf_counter() - start, decode_steps=width)
    summary.update(generate_s=min(walls), generate_runs_s=walls, generation_config=config.to_diff_dict())
    header = f"unprofiled: {walls} s; generation config (non-defaults): {json.dumps(config.to_diff_dict())}\n"
    return summary, text.replace("\n", "\n" + header, 1)


def _generator(trainer, impl: str, ids: list[list[int]], pad_id: int, torch):
    """(a call that generates and returns the completion width, the generation config it uses)."""
    if impl == "trl":

        def generate() -> int:
            completions, _ = trainer._generate_single_turn(ids, None, {}, trainer.num_generations)
            return max(len(c) for c in completions)

        return generate, trainer.generation_config
    width = max(len(r) for r in ids)
    device = trainer.accelerator.device
    prompt_ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in ids], device=device)
    prompt_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids], device=device)

    def generate() -> int:
        return trainer.generator.generate(prompt_ids, prompt_mask).completion_ids.shape[1]

    return generate, getattr(trainer.generator, "generation_config", trainer.generation_config)
