"""Generation backends behind one interface (`GenerationBackend` in base.py): transformers `generate` (hf.py),
transformers continuous batching (continuous.py), vLLM colocate (vllm_colocate.py, an in-process engine) and vLLM
server (vllm_server.py, a `replayrl vllm-serve` process). vLLM is imported only by the vLLM backends."""

from __future__ import annotations


def build_backend(args, model, tokenizer, generation_config):
    """The backend GRPOConfig `args` asks for: vLLM (`vllm_mode`) with `use_vllm`, else transformers' continuous
    batching with `use_transformers_continuous_batching` (as TRL, vLLM first), else transformers `generate`."""
    if not getattr(args, "use_vllm", False) and getattr(args, "use_transformers_continuous_batching", False):
        from replayrl.generation.continuous import ContinuousBatchingBackend

        settings = args.transformers_continuous_batching_config
        return ContinuousBatchingBackend(model, generation_config, settings)
    if not getattr(args, "use_vllm", False):
        from replayrl.generation.hf import HFGenerationBackend

        return HFGenerationBackend(model, generation_config)
    if args.vllm_mode == "server":
        from replayrl.generation.vllm_server import VLLMServerBackend

        return VLLMServerBackend.from_config(args, tokenizer, model)
    from replayrl.generation.vllm_colocate import VLLMColocateBackend

    return VLLMColocateBackend.from_config(args, model, tokenizer)


def check_vllm_config(args) -> None:
    """The vLLM options every trainer with `use_vllm` shares (GRPO's family, distillation), and vLLM itself
    (found without importing it: `import vllm` takes tens of seconds). Raises ValueError naming the fix."""
    import importlib.util

    from replayrl.generation.base import VLLM_EXTRA_HINT, MissingExtraError

    if args.vllm_mode not in ("colocate", "server"):
        raise ValueError(f"vllm_mode must be 'colocate' or 'server' (got {args.vllm_mode!r}).")
    if args.vllm_mode == "colocate" and args.world_size > 1:
        raise ValueError(
            f"vllm_mode='colocate' runs one in-process engine for a single training process (world_size is "
            f"{args.world_size}); use vllm_mode='server' with `replayrl vllm-serve`."
        )
    for name in ("vllm_guided_decoding_regex", "vllm_structured_outputs_regex"):
        if getattr(args, name, None) is not None:
            raise ValueError(f"{name} is not supported yet (the engine runs without a tokenizer); leave it None.")
    if args.vllm_group_port != 51216:
        raise ValueError(
            f"vllm_group_port={args.vllm_group_port}: replayrl syncs weights to a vLLM server through a shared "
            "folder, not an NCCL group, so the port is not used; leave it at its default."
        )
    if importlib.util.find_spec("vllm") is None:
        raise MissingExtraError(VLLM_EXTRA_HINT)
