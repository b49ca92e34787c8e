"""Does DeepSpeed ZeRO-3 divide the per-process training memory by the process count? Per-process bytes of
parameters, gradients and optimizer state after one SFTTrainer step, with 1 and with 2 CPU processes (gloo,
``DS_ACCELERATOR=cpu``, fp32, AdamW), for a Qwen2 with the 152k vocabulary (151,936 x 64 embedding and lm_head,
2 small layers: the vocabulary is most of the parameters, as in a 0.5B model's). Also what generation costs
with the weights gathered (``ds3_gather_for_generation=True``) and without (``False``: synced_gpus, each layer's
weights fetched in every decoding step): wall seconds and the extra resident memory while gathered.

    PYTHONPATH=$PWD python benchmarks/zero3_memory.py [--out benchmarks/results/zero3_memory.json]

Counted from DeepSpeed's own buffers on each process: parameters = the local partitions (``param.ds_tensor``),
gradients = ZeRO-3's flat gradient-partition buffer, optimizer state = the fp32 master partitions + AdamW's
``exp_avg`` / ``exp_avg_sq``. With one process every partition is whole, so that run is the one-process baseline.
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

VOCAB, HIDDEN = 151_936, 64
DS_CONFIG = {
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": False},
}


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def zero3_bytes(engine) -> dict[str, int]:
    """This process's bytes of parameter partitions, gradient partitions and optimizer state."""
    zero = engine.optimizer
    adam = [v for state in zero.optimizer.state.values() for v in state.values() if hasattr(v, "numel") and v.dim()]
    grads = [zero.grad_partitions_flat_buffer] if getattr(zero, "grad_partitions_flat_buffer", None) is not None else []
    return {
        "parameters": nbytes(p.ds_tensor for p in engine.module.parameters()),
        "gradients": nbytes(grads),
        "optimizer": nbytes(zero.fp32_partitioned_groups_flat) + nbytes(adam),
    }


def generation_cost(trainer, tokenizer, gather: bool) -> dict[str, float]:
    import torch

    from replayrl.generation.hf import generate_completions
    from replayrl.models.sharding import unwrap_for_generation

    ids = torch.tensor([[5, 6, 7, 8]] * 4)
    config = trainer.model_wrapped.module.generation_config
    config.update(max_new_tokens=8, min_new_tokens=8, do_sample=True, pad_token_id=tokenizer.pad_token_id)
    start_rss, start = rss(), time.perf_counter()
    with unwrap_for_generation(trainer.model_wrapped, trainer.accelerator, gather) as model:
        held = rss() - start_rss
        generate_completions(model, ids, torch.ones_like(ids), config)
    return {"seconds": time.perf_counter() - start, "extra_rss_while_held": held}


def worker(out: str) -> None:
    import torch
    from datasets import Dataset
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from replayrl import SFTConfig, SFTTrainer
    from replayrl.models.tiny import build_tokenizer, whole_construction

    torch.set_num_threads(1)
    tok = build_tokenizer()
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    with whole_construction():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    data = Dataset.from_dict({"prompt": ["1+1="] * 8, "completion": ["2"] * 8})
    args = SFTConfig(output_dir=out, per_device_train_batch_size=8 // int(os.environ["WORLD_SIZE"]), max_steps=1,
                     optim="adamw_torch", report_to="none", save_strategy="no", use_cpu=False, ddp_backend="gloo",
                     disable_tqdm=True, max_length=16)  # fmt: skip
    trainer = SFTTrainer(model, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    result = {"world": trainer.accelerator.num_processes, **zero3_bytes(trainer.model_wrapped)}
    result["whole_parameters"] = nbytes(p.ds_tensor.new_empty(p.ds_numel) for p in trainer.model.parameters())
    result["generation_gathered"] = generation_cost(trainer, tok, gather=True)
    result["generation_partitioned"] = generation_cost(trainer, tok, gather=False)
    if trainer.accelerator.is_main_process:
        Path(out, "result.json").write_text(json.dumps(result))


def launch(processes: int, work: Path, port: int) -> dict:
    ds = work / "ds.json"
    ds.write_text(json.dumps(DS_CONFIG))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    env.pop("ACCELERATE_USE_CPU", None)
    out = work / f"n{processes}"
    out.mkdir()
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes), "--num_machines",
           "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--use_deepspeed", "--deepspeed_config_file",
           str(ds), "--main_process_port", str(port), __file__, "--worker", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    return json.loads((out / "result.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="benchmarks/results/zero3_memory.json")
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    with tempfile.TemporaryDirectory() as tmp:
        one, two = launch(1, Path(tmp), 29681), launch(2, Path(tmp), 29683)
    keys = ("parameters", "gradients", "optimizer")
    total = {n: sum(r[k] for k in keys) for n, r in (("one", one), ("two", two))}
    print(f"{'bytes per process':<22}{'1 process':>14}{'2 processes':>14}{'ratio':>8}")
    for key in keys:
        print(f"{key:<22}{one[key]:>14,}{two[key]:>14,}{two[key] / one[key]:>8.3f}")
    print(f"{'total':<22}{total['one']:>14,}{total['two']:>14,}{total['two'] / total['one']:>8.3f}")
    for mode in ("gathered", "partitioned"):
        g = two[f"generation_{mode}"]
        print(f"generation, 2 processes, {mode}: {g['seconds']:.3f} s, +{g['extra_rss_while_held'] / 2**20:.1f} MiB")
    print(f"whole parameters (what gathering holds on each process): {two['whole_parameters']:,} bytes")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"one": one, "two": two, "ratio": total["two"] / total["one"]}, indent=1))


if __name__ == "__main__":
    main()
