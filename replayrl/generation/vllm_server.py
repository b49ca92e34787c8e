"""vLLM server mode: the trainer is an HTTP client of a `replayrl vllm-serve` process (same machine or another).

Generation: one `/v1/completions` request per batch with the prompts as token ids; the server returns the
sampled token ids and their log-probs. Weight sync: the trainer writes its (merged) weights to
`model.safetensors` in a temporary folder, asks the server's workers to reload from it (`/collective_rpc` to
the worker extension that `replayrl vllm-serve` installs), then resets the server's prefix cache. The folder
must be visible to the server: same machine or a shared filesystem (docs/vllm.md). Only the main process
syncs; the others wait at a barrier.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import torch
from torch import Tensor

from replayrl.generation.base import GenerationOutput, hf_state_dict, merged_adapter, pad_completions, unpad_prompts
from replayrl.generation.vllm_worker import INFO_METHOD, RELOAD_METHOD

logger = logging.getLogger(__name__)


class ServerError(ConnectionError):
    """The vLLM server is unreachable or answered with an error."""


def _request(url: str, payload: dict | None = None, timeout: float = 30.0) -> dict | None:
    """GET (payload None) or POST JSON; returns the decoded JSON body (None when empty)."""
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:300].replace("\n", " ")
        raise ServerError(f"vLLM server error {err.code} from {url}: {detail}") from err
    except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
        raise ServerError(f"vLLM server unreachable at {url}: {err}") from err
    return json.loads(body) if body else None


def wait_for_server(base_url: str, timeout: float, process=None) -> None:
    """Poll `/health` until it answers 200, at most `timeout` seconds; a clear error instead of a hang. With
    `process` (a Popen), also fail as soon as that process exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _request(f"{base_url}/health", timeout=5.0)
            return
        except ServerError as err:
            last = err
        if process is not None and process.poll() is not None:
            raise ServerError(f"the vLLM server process exited with status {process.returncode} before it was up")
        if time.monotonic() > deadline:
            raise ServerError(
                f"no vLLM server answered at {base_url}/health within {timeout:.0f} s ({last}). Start one with "
                "`replayrl vllm-serve --model <model>` and set vllm_server_base_url (or vllm_server_host/port)."
            )
        time.sleep(1.0)


def server_info(base_url: str, timeout: float = 30.0) -> dict:
    """What a `replayrl vllm-serve` server runs ({"dtype": ...}), asked of its workers through `/collective_rpc`;
    {} from a server without replayrl's worker extension."""
    try:
        response = _request(f"{base_url}/collective_rpc", {"method": INFO_METHOD}, timeout=timeout) or {}
    except ServerError:
        return {}
    results = response.get("results") or [{}]
    return results[0] if isinstance(results[0], dict) else {}


def dtype_mismatch(server_dtype: str | None, trainer_dtype: str) -> str | None:
    """The warning to give when the server computes in another dtype than the trainer (None when they agree or
    the server did not say)."""
    if server_dtype is None or server_dtype == trainer_dtype:
        return None
    return (
        f"the vLLM server runs the model in {server_dtype} but the trainer computes in {trainer_dtype}: the "
        "engine's and the trainer's log-probs will differ by rounding (e.g. ~2e-3 for bfloat16 against float32 "
        f"instead of ~1e-6), which the importance-sampling correction then treats as off-policy drift. Start the "
        f"server with `replayrl vllm-serve --dtype {trainer_dtype}` (vLLM's 'auto' runs float32 checkpoints in "
        "bfloat16 on CPU), or train in the server's dtype."
    )


def trainer_dtype(args, model) -> str:
    """The dtype the trainer's log-probs are computed in: the mixed-precision dtype if bf16/fp16, else the
    weights'."""
    if getattr(args, "bf16", False):
        return "bfloat16"
    if getattr(args, "fp16", False):
        return "float16"
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def server_url(args) -> str:
    """Base URL from GRPOConfig: `vllm_server_base_url`, else http://host:port (0.0.0.0 = this machine)."""
    if args.vllm_server_base_url:
        return args.vllm_server_base_url.rstrip("/")
    host = "127.0.0.1" if args.vllm_server_host in ("0.0.0.0", "") else args.vllm_server_host
    return f"http://{host}:{args.vllm_server_port}"


def save_weights(model, folder: str) -> None:
    """`model.safetensors` with the model's (merged) weights under checkpoint names; tensors that share storage
    (a tied lm_head) are written once, as `save_pretrained` does."""
    from safetensors.torch import save_file

    seen, tensors = set(), {}
    with merged_adapter(model):
        for name, tensor in hf_state_dict(model):
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
            if key in seen:
                continue
            seen.add(key)
            tensors[name] = tensor.detach().to("cpu").contiguous()
    save_file(tensors, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})


class VLLMServerBackend:
    """`GenerationBackend` that talks to a running `replayrl vllm-serve` server."""

    def __init__(self, base_url: str, sampling: dict, eos_token_id: int, pad_token_id: int, request_timeout: float):
        self.base_url = base_url
        self.sampling = sampling
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.request_timeout = request_timeout
        models = _request(f"{base_url}/v1/models", timeout=request_timeout) or {}
        self.model_name = (models.get("data") or [{}])[0].get("id")

    @classmethod
    def from_config(cls, args, tokenizer, model=None) -> VLLMServerBackend:
        from replayrl.generation.vllm_colocate import sampling_kwargs

        base_url = server_url(args)
        wait_for_server(base_url, args.vllm_server_timeout)
        info = server_info(base_url)
        logger.info("vLLM server at %s runs %s", base_url, info or "an unknown configuration")
        if model is not None and (message := dtype_mismatch(info.get("dtype"), trainer_dtype(args, model))):
            warnings.warn(message, UserWarning, stacklevel=2)
        sampling = sampling_kwargs(args, args.max_completion_length)
        sampling["logprobs"] = 0
        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        return cls(base_url, sampling, eos, pad, request_timeout=max(300.0, args.vllm_server_timeout))

    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor) -> GenerationOutput:
        prompts = unpad_prompts(prompt_ids, prompt_mask)
        payload = dict(self.sampling, model=self.model_name, prompt=prompts, return_token_ids=True)
        payload["stop_token_ids"] = [self.eos_token_id]
        response = _request(f"{self.base_url}/v1/completions", payload, timeout=self.request_timeout)
        choices = sorted(response["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts):
            raise ServerError(f"the vLLM server returned {len(choices)} completions for {len(prompts)} prompts")
        tokens = [c["token_ids"] for c in choices]
        logps = [c["logprobs"]["token_logprobs"] for c in choices]
        max_tokens = self.sampling["max_tokens"]
        return pad_completions(tokens, logps, [self.eos_token_id], self.pad_token_id, max_tokens, prompt_ids.device)

    @torch.no_grad()
    def sync_weights(self, model) -> None:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if not distributed or torch.distributed.get_rank() == 0:
            with tempfile.TemporaryDirectory(prefix="replayrl-sync-") as folder:
                save_weights(model, folder)
                self.reload_from(folder)
        if distributed:
            torch.distributed.barrier()

    def reload_from(self, folder: str) -> None:
        """Make the server's workers load `folder`/model.safetensors (`save_weights`); reset its prefix cache."""
        payload = {"method": RELOAD_METHOD, "args": [folder]}
        _request(f"{self.base_url}/collective_rpc", payload, timeout=self.request_timeout)
        _request(f"{self.base_url}/reset_prefix_cache", {}, timeout=self.request_timeout)

    def close(self) -> None:
        pass
