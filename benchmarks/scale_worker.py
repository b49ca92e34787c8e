"""One timed run of replayrl's or TRL's SFT (unpacked or packed), DPO, reward or GRPO trainer (or replayrl's GRPO with
the replay buffer) at real vocabulary size (run by `scale.py`); `grpo_vlm` / `grpo_vlm_replay`: GRPO on a
vision-language model and an image dataset saved with `datasets` (run by `vlm_scale.py`, see `vlm_assets.py`), with
the vision tower's saved activations per forward pass and the replay buffer's stored image bytes in the result.

    python benchmarks/scale_worker.py --impl replayrl --trainer sft --model-dir DIR --data-file FILE [...]

Prints `RESULT {json}`: wall seconds of every optimizer step (between two `on_step_end` callbacks, so everything the
Trainer does) and the process's CPU seconds over the same span, the tokens of every step, and the memory `train()`
used above what the process held when it was called: on a GPU `torch.cuda.max_memory_allocated()` (peak statistics
reset just before `train()`) minus the allocation then; on a CPU the peak resident set size during `train()` minus
the RSS just before it, the peak taken from the kernel's high-water mark (reset through /proc/self/clear_refs) and,
as a cross-check, a thread sampling VmRSS every millisecond; the larger of the two is reported. Every weight is read
once before `train()` (`page_in`), so weights memory-mapped by `from_pretrained` count on neither side. Also
`optimizer_floor_mib`: the gradient and AdamW's two moments of the trained weights, which no way of computing the
loss can avoid. With `--profile FILE`: one more optimizer step after the timed ones under torch.profiler (not timed,
after the memory probe stopped), and for GRPO one standalone generation on the step's prompts (`scale_profile.py`);
the tables go to FILE, a summary into the result. Imports only the standard library at module level: it also runs
inside the TRL virtualenv, where replayrl is not installed."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import scale_profile  # noqa: E402
import vlm_assets  # noqa: E402
from common import GRPO_SETTINGS, make_random_reward, median, rss_mib  # noqa: E402

# Spelled out for every trainer and both libraries (TRL 1.16 defaults to bf16=True and gradient checkpointing):
# GRPO's shared settings where they apply to every trainer, plus these.
_SHARED = ("max_grad_norm", "gradient_checkpointing", "logging_steps", "save_strategy", "report_to", "disable_tqdm")
COMMON = {k: GRPO_SETTINGS[k] for k in (*_SHARED, "dataloader_num_workers")}
COMMON.update(lr_scheduler_type="constant", dataloader_pin_memory=False, seed=0)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=["replayrl", "trl"], required=True)
    trainers = ["sft", "sft_packed", "dpo", "reward", "grpo", "grpo_replay", "grpo_static", "grpo_vlm"]
    trainers += ["grpo_vlm_replay"]
    p.add_argument("--trainer", choices=trainers, required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--data-file", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--max-completion-length", type=int, default=32)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--profile", help="profile one more step (and a GRPO generation); tables to this file")
    args = p.parse_args()
    if args.trainer in ("grpo_replay", "grpo_vlm_replay") and args.impl == "trl":
        p.error(f"{args.trainer} is replayrl's GRPOWithReplayBufferTrainer: there is no TRL peer (use --impl replayrl)")
    return args


class Memory:
    """Memory `train()` uses above its start: CUDA allocator peak on a GPU, else peak RSS (HWM + sampling)."""

    def __init__(self, cuda: bool):
        self.cuda, self.peak_sampled, self.running = cuda, 0.0, False

    def start(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated() / 2**20
            return
        try:  # "5": reset the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)
            Path("/proc/self/clear_refs").write_text("5")
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self.base = rss_mib()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while self.running:
            self.peak_sampled = max(self.peak_sampled, rss_mib())
            time.sleep(0.001)

    def stop(self) -> dict:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**20
            return {"memory_kind": "cuda_max_allocated", "base_mib": self.base, "peak_mib": peak}
        self.running = False
        self.thread.join()
        from common import peak_rss_mib

        hwm = peak_rss_mib() if self.hwm_reset else 0.0
        peak = max(hwm, self.peak_sampled)
        return {"memory_kind": "rss", "base_mib": self.base, "peak_mib": peak, "hwm_mib": hwm,
                "sampled_mib": self.peak_sampled}  # fmt: skip


def library(impl: str):
    if impl == "trl":
        import trl

        return trl
    sys.path.insert(0, str(BENCH_DIR.parent))
    import replayrl

    return replayrl


def build(args, lib, cuda: bool, count):
    """(trainer, tokens of a step or None when counted by the collator)."""
    import torch
    from datasets import load_dataset, load_from_disk
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    vlm = "vlm" in args.trainer  # a Qwen2.5-VL-shaped model and a saved image dataset (vlm_assets.py)
    data = load_from_disk(args.data_file) if vlm else load_dataset("json", data_files=args.data_file, split="train")
    tok = vlm_assets.load_processor(args.model_dir) if vlm else AutoTokenizer.from_pretrained(args.model_dir)
    max_steps = args.warmup + args.steps + bool(args.profile)  # the profiled step comes after the timed ones
    common = dict(COMMON, output_dir=tempfile.mkdtemp(prefix="scale-"), max_steps=max_steps)
    common.update(per_device_train_batch_size=args.batch, bf16=cuda, use_cpu=not cuda)
    dtype = torch.bfloat16
    if args.trainer.startswith("grpo"):
        settings = {**GRPO_SETTINGS, **common, "beta": 0.0, "num_generations": args.num_generations}
        settings.update(max_completion_length=args.max_completion_length, model_init_kwargs={"dtype": "bfloat16"})
        extra = {"use_bias_correction_kl": False} if args.impl == "trl" else {}
        config_cls, trainer_cls = lib.GRPOConfig, lib.GRPOTrainer
        if args.trainer.endswith("replay"):  # the same run plus the buffer (its documented default size, 64 groups)
            config_cls, trainer_cls = lib.GRPOWithReplayBufferConfig, lib.GRPOWithReplayBufferTrainer
            extra = {"replay_buffer_size": 64}
        if args.trainer == "grpo_static":  # transformers compiles a static cache's decoding step on a GPU (not TRL:
            # its GenerationConfig has disable_compile=True); prompts padded to one width, so one compiled shape
            settings.update(cache_implementation="static", pad_to_multiple_of=64)
        if vlm and args.impl == "replayrl":  # image prompts are never truncated; TRL 1.16 has no prompt limit
            extra["max_prompt_length"] = None
        config = config_cls(**settings, **extra)
        reward = make_random_reward(0)
        vision = {"processing_class": tok} if vlm else {}
        trainer = trainer_cls(model=args.model_dir, reward_funcs=[reward], args=config, train_dataset=data, **vision)
        return trainer, args.batch * args.max_completion_length  # random weights: EOS almost never sampled
    if args.trainer == "reward":
        model = AutoModelForSequenceClassification.from_pretrained(args.model_dir + "-rm", num_labels=1, dtype=dtype)
        extra = {} if args.impl == "trl" else {"append_eos": True}  # TRL appends EOS to text pairs
        config = lib.RewardConfig(learning_rate=1e-5, max_length=args.max_length, **common, **extra)
        trainer = lib.RewardTrainer(model, args=config, train_dataset=data, processing_class=tok)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=dtype)
        if args.trainer in ("sft", "sft_packed"):
            packing = args.trainer == "sft_packed"
            config = lib.SFTConfig(learning_rate=1e-5, max_length=args.max_length, packing=packing, **common)
            trainer = lib.SFTTrainer(model, args=config, train_dataset=data, processing_class=tok)
        else:
            config = lib.DPOConfig(learning_rate=1e-6, beta=0.1, max_length=args.max_length, **common)
            trainer = lib.DPOTrainer(model, args=config, train_dataset=data, processing_class=tok)
    inner = trainer.data_collator

    def counting_collator(features):
        count.append(sum(len(v) for f in features for k, v in f.items() if _is_token_ids(k, v)))
        return inner(features)

    trainer.data_collator = counting_collator
    return trainer, None


def _is_token_ids(key: str, value) -> bool:
    """A feature holding token ids (``input_ids``, ``prompt_ids``, ``input_ids_chosen``, ...; not position ids)."""
    ids = ("input_ids" in key or key.endswith("_ids")) and not any(w in key for w in ("position", "type", "attention"))
    return ids and isinstance(value, list)


def page_in(trainer) -> None:
    """Read every weight of the policy and of a reference or teacher model once before `train()`: `from_pretrained`
    may leave them memory-mapped from the safetensors file, so they would enter the RSS during `train()` on one side
    (TRL loads its DPO reference from the path) and before it on the other (replayrl copies the policy). Counted on
    neither side this way."""
    import torch

    with torch.no_grad():
        for name in ("model", "ref_model", "teacher_model"):
            model = getattr(trainer, name, None)
            if isinstance(model, torch.nn.Module):
                for tensor in [*model.parameters(), *model.buffers()]:
                    tensor.float().sum()


def measured_train(trainer, cuda: bool, stop_at: int | None = None, then=None) -> dict:
    """`page_in`, then `trainer.train()` under the memory probe: the probe's figures plus `working_set_mib`, the
    memory `train()` used above its start. `stop_at`: stop the probe at the end of that optimizer step instead (the
    later ones are profiled); `then`: a callback added after the probe's (the profiler)."""
    from transformers import TrainerCallback

    page_in(trainer)
    memory = Memory(cuda)
    mem: dict = {}

    class StopProbe(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == stop_at:
                mem.update(memory.stop())

    trainer.add_callback(StopProbe())
    if then is not None:
        trainer.add_callback(then)
    memory.start()
    trainer.train()
    if not mem:
        mem.update(memory.stop())
    return {**mem, "working_set_mib": mem["peak_mib"] - mem["base_mib"]}


def optimizer_floor_mib(trainer) -> float:
    """What any trainer that takes this AdamW step holds at its peak however it computes the loss: the gradient of
    every trainable weight (all of them exist together: `max_grad_norm` clips by their joint norm before the step)
    and AdamW's two moments (`exp_avg`, `exp_avg_sq`), each the weight's size and dtype."""
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    return 3 * sum(p.numel() * p.element_size() for p in trainable) / 2**20


def write_profile(args, trainer, parts: dict, cuda: bool) -> dict:
    """Add the standalone generation profile for GRPO (the first `batch / num_generations` prompts of the data file,
    each `num_generations` times, as a step samples them), write every part's tables to `args.profile`; the
    summaries."""
    if args.trainer.startswith("grpo"):
        with open(args.data_file) as f:
            prompts = [json.loads(line)["prompt"] for line, _ in zip(f, range(args.batch // args.num_generations))]
        prompts = [p for p in prompts for _ in range(args.num_generations)]
        try:
            parts["generate"] = scale_profile.generation_profile(trainer, args.impl, prompts, cuda)
        except Exception as e:  # noqa: BLE001 - reported; the run's timings are kept
            parts["generate"] = scale_profile.failed(e)
    title = f"{args.trainer} / {args.impl} ({'cuda' if cuda else 'cpu'})\n"
    Path(args.profile).write_text(title + "\n".join(text for _, text in parts.values()))
    return {name: summary for name, (summary, _) in parts.items()}


def main() -> None:
    args = parse()
    import torch
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(1)
    lib = library(args.impl)
    count: list[int] = []
    trainer, fixed_tokens = build(args, lib, cuda, count)
    ends: list[float] = []
    cpu_ends: list[float] = []  # CPU seconds of the process (all threads): less sensitive to a busy machine

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            ends.append(time.perf_counter())
            cpu_ends.append(time.process_time())

        def on_step_end(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            ends.append(time.perf_counter())
            cpu_ends.append(time.process_time())

    trainer.add_callback(Clock())
    tower = vlm_assets.VisionActivations(trainer.model) if "vlm" in args.trainer else None
    timed_end = args.warmup + args.steps
    parts: dict[str, tuple[dict, str]] = {}
    profiler = scale_profile.profile_callback(timed_end, cuda, parts) if args.profile else None
    mem = measured_train(trainer, cuda, stop_at=timed_end if profiler else None, then=profiler)
    steps = [b - a for a, b in zip(ends, ends[1:])][args.warmup : timed_end]
    cpu_steps = [b - a for a, b in zip(cpu_ends, cpu_ends[1:])][args.warmup : timed_end]
    tokens = [fixed_tokens] * len(steps) if fixed_tokens else count[args.warmup : args.warmup + len(steps)]
    loss = next((r["loss"] for r in trainer.state.log_history if "loss" in r), None)
    result = {"impl": args.impl, "trainer": args.trainer, "steps": steps, "cpu_steps": cpu_steps, "loss": loss}
    result["tokens_per_step"] = tokens
    # replayrl's own split of a GRPO step (timing/generation, timing/optimization, ...): median over timed steps
    timed = [r for r in trainer.state.log_history if "loss" in r][args.warmup : timed_end]
    keys = {k for r in timed for k in r if k.startswith("timing/")}
    result["timing"] = {k: median([r[k] for r in timed if k in r]) for k in sorted(keys)}
    result.update(mem)
    result["optimizer_floor_mib"] = optimizer_floor_mib(trainer)
    if tower is not None:
        result["vision_passes"] = tower.passes
    if getattr(trainer, "replay_buffer", None) is not None:  # what the buffer's groups hold of their prompts' images
        groups = trainer.replay_buffer.groups
        result["buffer_groups"] = len(groups)
        result["buffer_image_mib"] = [g.rollout.vision.nbytes() / 2**20 for g in groups if g.rollout.vision is not None]
    if args.profile:
        result["profile"] = write_profile(args, trainer, parts, cuda)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
