"""Shared pieces of the benchmark scripts: configurations, the reward, timers, statistics, tables, JSON output.

Imports only the standard library at module level (torch and transformers lazily), because `grpo_worker.py`
also runs inside the TRL virtualenv, where replayrl is not installed.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"


def _timing(warmup: int, steps: int, quick_warmup: int, quick_steps: int) -> dict:
    """Untimed warm-up steps and timed steps of a worker run, full and --quick."""
    return dict(warmup=warmup, steps=steps, quick_warmup=quick_warmup, quick_steps=quick_steps)


# The two configurations of issue 5 (tiny, larger) and one more. `batch` is per_device_train_batch_size, counted in
# completions (as in TRL): batch / num_generations prompts per optimizer step.
_TINY_MODEL = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
_LARGER_MODEL = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2)
_TINY_RUN = dict(batch=4, num_generations=4, max_completion_length=8, replay_buffer_size=8)
_LARGER_RUN = dict(batch=16, num_generations=8, max_completion_length=64, replay_buffer_size=64)
CONFIGS: dict[str, dict] = {
    "tiny": {**_TINY_MODEL, **_TINY_RUN, **_timing(3, 20, 2, 5)},
    "larger": {**_LARGER_MODEL, **_LARGER_RUN, **_timing(2, 8, 1, 3)},
    # `larger` with a real-sized vocabulary (the tokenizer still has ~100 tokens; the extra ids decode to nothing):
    # shows what the (B, T, V) logits of the loss passes cost, which the ~100-token vocabulary hides.
    "vocab32k": {**_LARGER_MODEL, "vocab_size": 32768, **_LARGER_RUN, **_timing(1, 5, 1, 2)},
}
MODEL_KEYS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads")

# GRPO settings shared by every run and by both libraries, spelled out so that neither side's defaults leak in
# (TRL defaults differ: temperature 1.0 vs 0.9, top_k 0 vs 50, beta 0.0 vs 0.04, bf16 and gradient checkpointing on).
GRPO_SETTINGS: dict = dict(
    learning_rate=1e-5,
    loss_type="dapo",
    scale_rewards="group",
    epsilon=0.2,
    num_iterations=1,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    mask_truncated_completions=False,
    max_grad_norm=1.0,
    bf16=False,
    gradient_checkpointing=False,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    disable_tqdm=True,
    dataloader_num_workers=0,
)


def make_random_reward(seed: int):
    """TRL's replay example reward: all zeros for 25% of the batches (so those groups have zero std), else
    uniform noise. Its own generator keeps the stream identical across libraries and trainers."""
    import torch

    generator = torch.Generator().manual_seed(seed)

    def custom_reward_func(completions, **kwargs):
        if torch.rand(1, generator=generator).item() < 0.25:
            return [0.0] * len(completions)
        return torch.rand(len(completions), generator=generator).tolist()

    return custom_reward_func


# ------------------------------------------------------------------------------------------------ timing
class StepTimer:
    """Wall time of every optimizer step, split into named parts.

    Parts are timed by wrapping methods from the outside (`wrap`), so the library under test is not modified.
    A step is the interval between two `on_step_end` callbacks (the first starts at `on_train_begin`), so it
    includes everything the Trainer does: data loading, generation, the loss passes, the optimizer, logging.
    `other` is the step time not covered by any part.
    """

    def __init__(self, sync_cuda: bool = False):
        self.sync_cuda = sync_cuda
        self.current: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.last_mark = None
        self.last_training_step_end = None
        self.depth = 0  # >0 while inside `generate`: forward calls there count as generation

    def now(self) -> float:
        if self.sync_cuda:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    def wrap(self, obj, attr: str, part: str, when=None) -> None:
        """Replace `obj.attr` by a timed version adding its wall time to `part` (if `when()` holds, when given)."""
        original = getattr(obj, attr)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            if when is not None and not when():
                return original(*args, **kwargs)
            start = self.now()
            try:
                return original(*args, **kwargs)
            finally:
                self.current[part] += self.now() - start

        setattr(obj, attr, timed)

    def wrap_generate(self, model) -> None:
        original = model.generate

        def generate(*args, **kwargs):
            self.depth += 1
            start = self.now()
            try:
                return original(*args, **kwargs)
            finally:
                self.current["generation"] += self.now() - start
                self.depth -= 1

        model.generate = generate

    def callback(self):
        from transformers import TrainerCallback

        timer = self

        class _Clock(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                timer.last_mark = timer.now()
                timer.current.clear()

            def on_step_end(self, args, state, control, **kwargs):
                end = timer.now()
                parts = dict(timer.current)
                if timer.last_training_step_end is not None:
                    # clip + optimizer.step + scheduler + zero_grad
                    parts["optimizer"] = end - timer.last_training_step_end
                parts["step"] = end - timer.last_mark
                parts["other"] = parts["step"] - sum(v for k, v in parts.items() if k != "step")
                timer.steps.append(parts)
                timer.current.clear()
                timer.last_mark = end

        return _Clock()

    def wrap_training_step(self, trainer) -> None:
        original = trainer.training_step

        def training_step(*args, **kwargs):
            out = original(*args, **kwargs)
            self.last_training_step_end = self.now()
            return out

        trainer.training_step = training_step


# ------------------------------------------------------------------------------------------------ statistics
def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def print_table(rows: list[dict], columns: list[str], title: str = "") -> str:
    """Print a plain-text table (floats with 4 significant digits) and return it."""

    def fmt(v) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    lines = [title] if title else []
    lines.append("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


# ------------------------------------------------------------------------------------------------ environment
def _proc_status_mib(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def rss_mib() -> float:
    """Current resident set size of this process (Linux; 0 elsewhere)."""
    return _proc_status_mib("VmRSS") or 0.0


def peak_rss_mib() -> float:
    """Peak resident set size of this process.

    Linux: VmHWM, the high-water mark of this process's own memory map. Not `getrusage().ru_maxrss`: that survives
    execve, so a worker started by a big parent (fork + exec) reports at least the parent's RSS at fork time.
    """
    hwm = _proc_status_mib("VmHWM")
    if hwm is not None:
        return hwm
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 / 1024 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB elsewhere


def machine_info() -> dict:
    import torch

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    try:
        with open("/proc/loadavg") as f:
            info["loadavg_at_start"] = f.read().split()[:3]
    except OSError:
        pass
    return info


def git_revision() -> str:
    try:

        def git(*a: str) -> str:
            return subprocess.run(["git", *a], cwd=REPO_DIR, capture_output=True, text=True).stdout.strip()

        return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain", "replayrl") else "")
    except OSError:
        return "unknown"


def write_results(name: str, payload: dict, quick: bool = False) -> Path:
    """Write `benchmarks/results/<name>.json` (`<name>_quick.json` for --quick runs, so that a smoke run never
    overwrites measured results) with the command line, machine and git revision added."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}{'_quick' if quick else ''}.json"
    meta = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "git": git_revision(), **machine_info()}
    path.write_text(json.dumps({"meta": meta, **payload}, indent=2, default=float) + "\n")
    print(f"wrote {path.relative_to(REPO_DIR)}", flush=True)
    return path


def remove_scratch(work: Path) -> None:
    """Delete a script's scratch directory (models, prompt file, worker logs) after a successful run; a failed run
    keeps it, and `run_worker` errors name the log to read."""
    shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ assets + workers
def prepare_assets(work_dir: Path, config_name: str, num_prompts: int = 512) -> tuple[Path, Path]:
    """Save the config's tiny model + tokenizer and a prompt file (JSON lines) under `work_dir`; reused if present.
    Needs replayrl (runs in the main environment); both libraries then load exactly these files."""
    from replayrl.models.tiny import prompt_dataset, save_tiny

    cfg = CONFIGS[config_name]
    model_dir = work_dir / f"model-{config_name}"
    if not (model_dir / "config.json").exists():
        save_tiny(model_dir, **{k: cfg[k] for k in MODEL_KEYS})
        if "vocab_size" in cfg:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(model_dir)
            model.resize_token_embeddings(cfg["vocab_size"], mean_resizing=False)
            model.save_pretrained(model_dir)
    data_file = work_dir / "prompts.jsonl"
    if not data_file.exists():
        rows = prompt_dataset(num_prompts, seed=0).to_list()
        data_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model_dir, data_file


def run_worker(
    python: str | Path,
    args: list[str],
    log_file: Path | None = None,
    threads: int = 1,
    timeout: float = 1800,
    extra_env: dict[str, str] | None = None,
) -> dict:
    """Run `grpo_worker.py` under `python` and return the JSON it prints on its `RESULT ` line.

    `threads` sets OMP_NUM_THREADS. On a small shared CPU keep it at 1: with 2 threads on 2 busy cores, OpenMP
    threads wait for each other and a 64x64 matmul takes ~100x longer (measured 7.6 us -> 860 us). `extra_env`:
    extra environment variables for the worker (applied last; e.g. PYTHONPATH, so a venv imports this checkout).
    """
    cmd = [str(python), str(BENCH_DIR / "grpo_worker.py"), *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.update(TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.pop("PYTHONPATH", None)  # the TRL venv must not see the main environment's packages
    env.update(extra_env or {})
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log_file.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
    raise RuntimeError(f"worker failed (rc={proc.returncode}, log: {log_file}): {' '.join(cmd)}\n{tail}")


def summarize_run(result: dict, skip: int = 0) -> dict:
    """Medians over the measured steps of one worker run (`skip` more leading steps dropped)."""
    steps = result["steps"][skip:]
    out = {"step_s": median(s["step"] for s in steps)}
    parts = sorted({k for s in steps for k in s if k != "step"})
    for part in parts:
        out[part] = median(s.get(part, 0.0) for s in steps)
    tokens = result.get("tokens_per_step") or []
    if tokens:
        out["tokens_per_s"] = median(tokens) / out["step_s"]
    out["peak_rss_mib"] = result["peak_rss_mib"]
    out["rss_growth_mib"] = result["peak_rss_mib"] - result["rss_before_train_mib"]
    if result.get("peak_gpu_mib") is not None:
        out["peak_gpu_mib"] = result["peak_gpu_mib"]
    return out
