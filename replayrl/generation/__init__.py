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
