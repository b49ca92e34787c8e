"""Code that runs inside a vLLM worker: the weight reload and the tied-lm_head re-pack, shared by the colocate
engine (called in-process through `collective_rpc`) and the server (`ReplayRLWorkerExtension`, which
`replayrl vllm-serve` installs with `--worker-extension-cls`). Imports torch only, so a worker can load it."""

from __future__ import annotations

WORKER_EXTENSION = "replayrl.generation.vllm_worker.ReplayRLWorkerExtension"
RELOAD_METHOD = "replayrl_reload_weights"
INFO_METHOD = "replayrl_info"


def worker_info(worker) -> dict:
    """What the worker runs: {"dtype": the loaded weights' dtype, e.g. "bfloat16"}. vLLM's `--dtype auto` takes
    the checkpoint's dtype on GPU but bfloat16 for a float32 checkpoint on CPU, so the server says which."""
    weights = next(worker.model_runner.model.parameters())
    return {"dtype": str(weights.dtype).removeprefix("torch.")}


def repack_tied_lm_head(model) -> None:
    """After a reload, refresh the packed copy of a tied lm_head. vLLM's CPU build re-packs linear weights into
    its own layout after loading; a tied lm_head shares the embedding's parameter but keeps its own packed copy,
    which a reload of the embedding leaves stale (12-18 nats of log-prob error). A no-op for untied heads."""
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if lm_head is None or embed is None or getattr(lm_head, "weight", None) is not getattr(embed, "weight", None):
        return
    quant_method = getattr(lm_head, "quant_method", None)
    if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
        quant_method.process_weights_after_loading(lm_head)


def reload_weights(worker, weights=None, path: str | None = None) -> None:
    """Reload the worker's model from (name, tensor) pairs or from a folder holding `model.safetensors`, in the
    checkpoint's (Hugging Face) names, then re-pack a tied lm_head."""
    if weights is not None:
        worker.reload_weights(weights_iterator=iter(weights))
    else:
        worker.reload_weights(weights_path=path)
    repack_tied_lm_head(worker.model_runner.model)


class ReplayRLWorkerExtension:
    """Mixed into the server's workers by vLLM (`--worker-extension-cls`); called through `/collective_rpc`,
    whose arguments are strings."""

    def replayrl_reload_weights(self, path: str) -> None:
        reload_weights(self, path=path)

    def replayrl_info(self) -> dict:
        return worker_info(self)
