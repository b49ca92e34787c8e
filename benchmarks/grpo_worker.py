"""One timed GRPO training run, with replayrl or with TRL; prints its per-step figures as one `RESULT {json}` line.

Not meant to be run by hand (the benchmark scripts call it), but it can be:

    python benchmarks/grpo_worker.py --impl replayrl --config tiny --model-dir DIR --data-file FILE

It runs under either virtualenv: at module level it imports only the standard library and `common`; torch,
transformers and the library under test are imported in `main`. Both libraries get the same saved model, the same
prompts, the same reward stream and the GRPO settings of `common.GRPO_SETTINGS`.

Parts of a step (seconds, see `common.StepTimer`): generation (`model.generate`), rewards (the reward function),
logps (no-grad log-prob passes: reference model when beta > 0, old policy when off-policy), loss_fwd
(`compute_loss`: forward with grad + loss + its metrics), backward (`accelerator.backward`), optimizer (grad clip +
`optimizer.step` + scheduler + zero_grad), replay (replayrl's buffer hooks), other (the rest: tokenising,
decoding, advantages, generation metrics, logging, data loading).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    CONFIGS,
    GRPO_SETTINGS,
    StepTimer,
    make_random_reward,
    peak_rss_mib,
    rss_mib,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--impl", choices=["replayrl", "trl"], required=True)
    p.add_argument("--config", choices=sorted(CONFIGS), required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--data-file", required=True)
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--replay-buffer-size", type=int, default=0, help="replayrl only; 0 = plain GRPOTrainer")
    p.add_argument("--warmup", type=int, default=None, help="untimed optimizer steps first (default: per config)")
    p.add_argument("--steps", type=int, default=None, help="timed optimizer steps (default: per config)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default=None)
    p.add_argument("--cprofile", default=None, help="write cProfile stats of the timed steps to this file")
    p.add_argument("--torch-profile", default=None, help="write a torch.profiler op table of the timed steps here")
    p.add_argument("--cpu", action="store_true", help="stay on CPU even if CUDA is available")
    p.add_argument("--candidate", nargs="*", default=[], help="replayrl only: prototype speed-ups (candidates.py)")
    p.add_argument("--vllm", action="store_true", help="replayrl only: generate with vLLM colocate (needs vllm)")
    args = p.parse_args(argv)
    if args.vllm and args.impl == "trl":
        p.error("--vllm is replayrl only: TRL's vLLM path does not run on a CPU (see vs_trl.py)")
    return args


def build_trainer(args, reward_func, device_cpu: bool):
    cfg = CONFIGS[args.config]
    from datasets import Dataset

    rows = [json.loads(line) for line in Path(args.data_file).read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list(rows)
    common = dict(
        GRPO_SETTINGS,
        output_dir=args.output_dir,
        per_device_train_batch_size=cfg["batch"],
        num_generations=cfg["num_generations"],
        max_completion_length=cfg["max_completion_length"],
        beta=args.beta,
        max_steps=args.warmup + args.steps,
        seed=args.seed,
        use_cpu=device_cpu,
        # Both sides the plain k3 KL, as the figures recorded before both defaulted to the bias-corrected one.
        use_bias_correction_kl=False,
    )
    if args.impl == "trl":
        from trl import GRPOConfig, GRPOTrainer

        config = GRPOConfig(**common)
        return GRPOTrainer(model=args.model_dir, reward_funcs=[reward_func], args=config, train_dataset=dataset)
    if args.vllm:  # in-process engine; everything else as above
        # max_model_len: the tiny models' max_position_embeddings (512); the default, max_prompt_length (512) +
        # max_completion_length, is longer and vLLM refuses it. The prompts are far shorter than either.
        common.update(use_vllm=True, vllm_mode="colocate", vllm_max_model_length=512)
    if args.replay_buffer_size > 0:
        from replayrl import GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer

        config = GRPOWithReplayBufferConfig(**common, replay_buffer_size=args.replay_buffer_size)
        cls = GRPOWithReplayBufferTrainer
    else:
        from replayrl import GRPOConfig, GRPOTrainer

        config, cls = GRPOConfig(**common), GRPOTrainer
    return cls(model=args.model_dir, reward_funcs=[reward_func], args=config, train_dataset=dataset)


def instrument(trainer, timer: StepTimer, impl: str) -> None:
    """Wrap the methods whose time makes up a step (see the module docstring)."""
    import torch

    model = trainer.accelerator.unwrap_model(trainer.model)
    timer.wrap_generate(model)
    timer.wrap(trainer, "compute_loss", "loss_fwd")
    timer.wrap(trainer.accelerator, "backward", "backward")
    timer.wrap_training_step(trainer)
    if impl == "replayrl":
        if getattr(trainer.args, "use_vllm", False):
            # model.generate is never called: time the engine's generate, and the weight sync on its own.
            timer.wrap(trainer.generator, "generate", "generation")
            timer.wrap(trainer.generator, "sync_weights", "sync")
        timer.wrap(trainer, "_add_logps", "logps")
        timer.wrap(trainer, "_postprocess_rollout", "replay")
        timer.wrap(trainer, "_after_first_pass", "replay")
    else:
        # TRL computes old/ref log-probs inside _generate_and_score_completions: no-grad forwards outside generate.
        def outside_generate_no_grad():
            return timer.depth == 0 and not torch.is_grad_enabled()

        for m in (model, getattr(trainer, "ref_model", None)):
            if m is not None:
                timer.wrap(m, "forward", "logps", when=outside_generate_no_grad)


def main(argv=None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="replayrl-bench-worker-") as scratch:
        args.output_dir = args.output_dir or scratch  # nothing is saved (save_strategy="no")
        run(args)


def run(args: argparse.Namespace) -> None:
    cfg = CONFIGS[args.config]
    args.warmup = cfg["warmup"] if args.warmup is None else args.warmup
    args.steps = cfg["steps"] if args.steps is None else args.steps
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    cuda = torch.cuda.is_available() and not args.cpu
    timer = StepTimer(sync_cuda=cuda)

    base_reward = make_random_reward(args.seed)

    @functools.wraps(base_reward)
    def custom_reward_func(*a, **kw):
        start = timer.now()
        try:
            return base_reward(*a, **kw)
        finally:
            timer.current["rewards"] += timer.now() - start

    if args.candidate:
        import candidates

        candidates.apply(args.candidate)
        if "lean_generate" in args.candidate:  # it bypasses model.generate: time the patched function instead
            import replayrl.grpo.trainer

            timer.wrap(replayrl.grpo.trainer, "generate_completions", "generation")
    trainer = build_trainer(args, custom_reward_func, device_cpu=not cuda)
    instrument(trainer, timer, args.impl)
    trainer.add_callback(timer.callback())
    profiler = Profiler(args)
    trainer.add_callback(profiler.callback())
    rss_before = rss_mib()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    profiler.finish()
    print("RESULT " + json.dumps(collect(args, trainer, timer, rss_before, cuda)), flush=True)


def collect(args: argparse.Namespace, trainer, timer: StepTimer, rss_before: float, cuda: bool) -> dict:
    """The worker's result: per-step parts and tokens after the warm-up steps, a few logged metrics, memory."""
    import torch
    import transformers

    history = [h for h in trainer.state.log_history if "num_tokens" in h]
    cumulative = [h["num_tokens"] for h in history]
    tokens = [b - a for a, b in zip([0.0] + cumulative[:-1], cumulative)]
    keep = ("frac_reward_zero_std", "replay/frac_zero_std_trained", "timing/generation", "timing/logps")
    logged = {k: [h[k] for h in history if k in h][args.warmup :] for k in keep}
    if args.impl == "trl":
        import trl

        version = trl.__version__
    else:
        import replayrl

        version = replayrl.__version__
    return {
        "impl": args.impl,
        "version": version,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "config": args.config,
        "beta": args.beta,
        "replay_buffer_size": args.replay_buffer_size,
        "candidate": args.candidate,
        "vllm": args.vllm,
        "seed": args.seed,
        "warmup": args.warmup,
        "trainer": type(trainer).__name__,
        "steps": timer.steps[args.warmup :],
        "tokens_per_step": tokens[args.warmup :],
        "completion_length": [h.get("completion_length") for h in history][args.warmup :],
        "logged": {k: v for k, v in logged.items() if v},
        "rss_before_train_mib": rss_before,
        "peak_rss_mib": peak_rss_mib(),
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        "torch_threads": torch.get_num_threads(),
    }


class Profiler:
    """Optional cProfile / torch.profiler over the timed steps only (starts after the warm-up steps)."""

    def __init__(self, args):
        self.args = args
        self.cprofile = cProfile.Profile() if args.cprofile else None
        self.torch_prof = None
        self.running = False

    def start(self) -> None:
        if self.cprofile is not None:
            self.cprofile.enable()
        if self.args.torch_profile:
            import torch

            cpu = torch.profiler.ProfilerActivity.CPU
            self.torch_prof = torch.profiler.profile(activities=[cpu], record_shapes=True)
            self.torch_prof.__enter__()
        self.running = True

    def finish(self) -> None:
        if not self.running:
            return
        self.running = False
        if self.cprofile is not None:
            self.cprofile.disable()
            self.cprofile.dump_stats(self.args.cprofile)
        if self.torch_prof is not None:
            self.torch_prof.__exit__(None, None, None)
            table = self.torch_prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=60)
            grouped = self.torch_prof.key_averages(group_by_input_shape=True).table(
                sort_by="self_cpu_time_total", row_limit=40
            )
            Path(self.args.torch_profile).write_text(table + "\n\nby input shape\n" + grouped)

    def callback(self):
        from transformers import TrainerCallback

        prof = self

        class _ProfilerCallback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                if prof.args.warmup == 0:
                    prof.start()

            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == prof.args.warmup and (prof.args.cprofile or prof.args.torch_profile):
                    prof.start()

        return _ProfilerCallback()


if __name__ == "__main__":
    main()
