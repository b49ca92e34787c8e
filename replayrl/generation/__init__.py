"""Generation backends behind one interface (`GenerationBackend` in base.py): transformers `generate` (hf.py),
vLLM colocate (vllm_colocate.py, an in-process engine) and vLLM server (vllm_server.py, a `replayrl vllm-serve`
process). vLLM is imported only by the vLLM backends."""

from __future__ import annotations


def build_backend(args, model, tokenizer, generation_config):
    """The backend GRPOConfig `args` asks for: transformers `generate` unless `use_vllm`, then `vllm_mode`."""
    if not getattr(args, "use_vllm", False):
        from replayrl.generation.hf import HFGenerationBackend

        return HFGenerationBackend(model, generation_config)
    if args.vllm_mode == "server":
        from replayrl.generation.vllm_server import VLLMServerBackend

        return VLLMServerBackend.from_config(args, tokenizer, model)
    from replayrl.generation.vllm_colocate import VLLMColocateBackend

    return VLLMColocateBackend.from_config(args, model, tokenizer)
