"""A generation worker process for asynchronous GRPO: transformers `generate` on its own copy of the policy.

The trainer's side, `GenerationWorker`, owns everything that runs concurrently: one spawned process, its request and
result queues, and a shared-memory copy of the policy's weights (one tensor per state-dict entry, under the names of
`hf_state_dict`) with a lock and a version counter. The trainer writes new weights into the shared copy
(`push_weights`); before each request the worker copies them into its own model when their version changed. Requests
are whole generation batches (left-padded prompt ids and a seed); results carry the weights' version, the sampled
completions and the engine's log-probs of the sampled tokens at the sampling temperature (recorded step by step, one
`(N, V)` row of logits at a time, so no `(N, C, V)` tensor is kept).

While the worker starts (importing torch and transformers takes seconds), the trainer need not wait:
`claim_unstarted()` takes back the requests the worker has not begun and generates them in the trainer's process, on
a copy of the shared weights as the worker would have loaded them, with the same seed and the same code, so a batch
is the same whoever sampled it and a run does not depend on how fast the worker started. The copy is dropped once
the worker is up.

The worker ends with `close()`, when its parent dies (it polls), or on an exception, whose message and traceback it
sends back before exiting: `result()` raises it in the trainer within a second.
"""

from __future__ import annotations

import queue
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from replayrl.generation.base import hf_state_dict, merged_adapter

POLL_SECONDS = 0.5


class GenerationWorkerError(RuntimeError):
    """The generation worker failed (its exception's message), or died."""


@dataclass
class WorkerResult:
    """One generated batch: N rows, C = longest completion."""

    batch: int  # the caller's batch key
    version: int  # the weights' version (optimizer step) that sampled it
    completion_ids: Tensor  # (N, C) long, padded after the first EOS
    completion_mask: Tensor  # (N, C) long
    truncated: Tensor  # (N,) bool
    logps: Tensor  # (N, C) float32, the engine's log-probs of its tokens (NaN on padding)
    seconds: float  # generation time
    weight_seconds: float  # time spent waiting for and loading new weights before generating
    here: bool = False  # generated in the trainer's process (claimed while the worker was starting)


class SampledLogps:
    """A logits processor that records log p(sampled token) at `temperature` (raw logits, before top-k/top-p: the
    distribution the trainer's log-probs use). Placed among the custom processors, which transformers applies before
    its temperature and top-k/top-p warpers; step t's call sees the token sampled at step t - 1."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous: Tensor | None = None
        self.logps: list[Tensor] = []

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        self._record(input_ids[:, -1])
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _record(self, tokens: Tensor) -> None:
        if self.previous is not None:
            self.logps.append(self.previous.gather(1, tokens.unsqueeze(1)).squeeze(1))
            self.previous = None

    def finish(self, completion_ids: Tensor) -> Tensor:
        """(N, C) log-probs of `completion_ids` (the last token's from the final step's logits)."""
        if completion_ids.shape[1] > len(self.logps):
            self._record(completion_ids[:, len(self.logps)])
        width = completion_ids.shape[1]
        out = torch.stack(self.logps[:width], dim=1) if width else torch.zeros(completion_ids.shape[0], 0)
        return out


class GenerationWorker:
    """The trainer's handle on one generation worker process (see the module docstring)."""

    def __init__(self, model, generation_config, version: int, threads: int = 1, device="cpu"):
        import torch.multiprocessing as mp  # registers torch's tensor sharing with multiprocessing's pickler

        ctx = mp.get_context("spawn")
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        with merged_adapter(model):
            self._weights = {name: t.to("cpu", copy=True).share_memory_() for name, t in hf_state_dict(model)}
        self._lock, self._version = ctx.Lock(), ctx.Value("q", version)
        # requests begun by the worker (it has loaded their weights) or claimed by the trainer, in submission order
        self._started = ctx.Value("q", 0)
        self._ready = ctx.Value("b", 0)  # set by the worker once its model is built: claims stop then
        self._requests, self._results = ctx.Queue(), ctx.Queue()
        self._submitted = 0
        self._kept: dict[int, tuple] = {}  # request number -> (batch, prompt ids, mask, seed), until begun or claimed
        self._local, self._local_version = None, -1  # the trainer's copy for claimed requests, while the worker starts
        self._config, self._dtype = base.config, next(iter(self._weights.values())).dtype
        self._generation_config, self._device = generation_config.to_dict(), device
        args = (self._config, self._dtype, self._weights, self._lock, self._version, self._started, self._ready)
        args += (self._requests, self._results, self._generation_config, threads, str(device))
        self._process = ctx.Process(target=_worker_main, args=args, daemon=True, name="replayrl-generation-worker")
        with _main_module_hidden():
            self._process.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def push_weights(self, model, version: int, wait_for_start: bool = False) -> float:
        """Write `model`'s weights into the shared copy as `version`. `wait_for_start`: first wait until the worker
        has begun every submitted request, so each is sampled with the weights current when it was submitted.
        Returns the seconds spent."""
        start = time.perf_counter()
        while wait_for_start and self._started.value < self._submitted:
            self._check_alive()
            time.sleep(0.001)
        with merged_adapter(model), torch.no_grad(), self._lock:
            for name, tensor in hf_state_dict(model):
                self._weights[name].copy_(tensor)
            self._version.value = version
        return time.perf_counter() - start

    def submit(self, batch: int, prompt_ids: Tensor, prompt_mask: Tensor, seed: int) -> None:
        self._check_alive()
        n = self._submitted
        self._requests.put((n, batch, prompt_ids.cpu().numpy(), prompt_mask.cpu().numpy(), seed))
        self._kept = {m: r for m, r in self._kept.items() if m >= self._started.value}
        self._kept[n] = (batch, prompt_ids, prompt_mask, seed)
        self._submitted += 1

    def claim_unstarted(self) -> list[WorkerResult]:
        """While the worker is still starting: the submitted requests it has not begun, taken back and generated
        here, in order, each with the weights the worker would have loaded for it: the same results. Empty once the
        worker's model is built (the trainer's copy of the weights is dropped then): from there on the trainer
        waits for the worker, which a busy machine may slow down but never turns back into taking turns."""
        if self._ready.value:
            self._local = None
            return []
        with self._started.get_lock():
            first = self._started.value
            self._started.value = self._submitted
        claimed = [self._kept.pop(n) for n in range(first, self._submitted)]
        try:
            return [self._generate_here(*request) for request in claimed]
        except Exception as exc:  # the same failure the worker would have reported
            raise GenerationWorkerError(f"the generation worker failed: {type(exc).__name__}: {exc}") from exc

    def _generate_here(self, batch: int, prompt_ids: Tensor, prompt_mask: Tensor, seed: int) -> WorkerResult:
        devices = [self._device] if torch.device(self._device).type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # building the copy and sampling leave the trainer's RNG as is
            start = time.perf_counter()
            if self._local is None:
                self._local = _build_model(self._config, self._dtype).to(self._device)
                self._local_version = -1
            version = _load_weights(self._local, self._weights, self._lock, self._version, self._local_version)
            self._local_version = version
            loaded = time.perf_counter()
            prompt_ids, prompt_mask = prompt_ids.to(self._device), prompt_mask.to(self._device)  # as the worker's
            out = _generate(self._local, prompt_ids, prompt_mask, self._generation_config, seed)
            seconds = time.perf_counter() - loaded
        return WorkerResult(batch, version, *[t.cpu() for t in out], seconds, loaded - start, here=True)

    def result(self) -> WorkerResult:
        """The next finished batch (in submission order); raises `GenerationWorkerError` if the worker failed."""
        while True:
            try:
                message = self._results.get(timeout=POLL_SECONDS)
            except queue.Empty:
                self._check_alive()
                continue
            if message[0] == "error":
                raise GenerationWorkerError(f"the generation worker failed: {message[1]}\n{message[2]}")
            _, batch, version, ids, mask, truncated, logps, seconds, weight_seconds = message
            return WorkerResult(
                batch,
                version,
                torch.from_numpy(ids),
                torch.from_numpy(mask),
                torch.from_numpy(truncated),
                torch.from_numpy(logps),
                seconds,
                weight_seconds,
            )

    def _check_alive(self) -> None:
        if not self._process.is_alive():
            raise GenerationWorkerError(
                f"the generation worker (pid {self._process.pid}) exited with code {self._process.exitcode}"
            )

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker and wait for it; terminate (then kill) it if it does not stop in `timeout` seconds."""
        if self._process.is_alive():
            try:
                self._requests.put(None)
            except (ValueError, OSError):  # queue already closed
                pass
            self._process.join(timeout)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(2.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(2.0)
        _drain(self._requests)  # what the worker did not read: the queue's feeder thread can then finish
        self._requests.close()
        self._requests.join_thread()
        self._results.close()


def _drain(q) -> None:
    try:
        while True:
            q.get(timeout=0.05)
    except (queue.Empty, OSError, ValueError, EOFError):
        pass


@contextmanager
def _main_module_hidden():
    """Start a spawned process without re-running the caller's script in it: `spawn` imports `__main__` again in the
    child (as `__mp_main__`), which runs a script without an `if __name__ == "__main__":` guard a second time and
    fails. The worker needs nothing from `__main__`, so its name and path are hidden while the process starts."""
    main = sys.modules.get("__main__")
    saved = {name: getattr(main, name) for name in ("__file__", "__spec__") if hasattr(main, name)}
    if "__file__" in saved:
        del main.__file__
    main.__spec__ = None
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(main, name, value)


# ------------------------------------------------------------------------------------------------ worker process
def _worker_main(
    config, dtype, weights, lock, version, started, ready, requests, results, generation_config, threads, device
):
    _exit_with_parent()
    try:
        torch.set_num_threads(threads)
        model, local = _build_model(config, dtype).to(device), -1
        ready.value = 1
        while True:
            request = _next_request(requests)
            if request is None:
                return
            n, batch, prompt_ids, prompt_mask, seed = request
            start = time.perf_counter()
            local = _load_weights(model, weights, lock, version, local)
            with started.get_lock():
                if n < started.value:  # the trainer claimed it while this process was starting
                    continue
                started.value = n + 1
            loaded = time.perf_counter()
            ids, mask = (torch.from_numpy(x).to(device) for x in (prompt_ids, prompt_mask))
            out = _generate(model, ids, mask, generation_config, seed)
            seconds = time.perf_counter() - loaded
            results.put(("ok", batch, local, *[t.cpu().numpy() for t in out], seconds, loaded - start))
    except BaseException as exc:  # noqa: BLE001 - the trainer must learn of every failure
        results.put(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))


def _exit_with_parent() -> None:
    """On Linux, have the kernel kill this process when the trainer dies, however it dies (SIGKILL, SIGTERM without
    cleanup): polling the parent between requests is not enough, since a parent killed in the middle of sending a
    request leaves this process blocked forever on the half-written message (it holds the pipe's write end too, so
    no end-of-file comes). Elsewhere the polling remains."""
    import multiprocessing
    import os
    import signal

    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    parent = multiprocessing.parent_process()
    if parent is not None and not parent.is_alive():  # it died before the line above
        os._exit(0)


def _build_model(config, dtype):
    import copy

    from transformers import AutoModelForCausalLM

    # transformers' Trainer sets the policy's `config.use_cache` to `args.use_cache` (False), and a model built from
    # that config would generate without a KV cache (2.5x slower on the benchmark's 48-token completions)
    config = copy.deepcopy(config)
    config.use_cache = True
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    return model


def _next_request(requests):
    """The next request, or None when asked to stop or when the parent process died."""
    import multiprocessing

    while True:
        try:
            return requests.get(timeout=POLL_SECONDS)
        except queue.Empty:
            parent = multiprocessing.parent_process()
            if parent is not None and not parent.is_alive():
                return None


def _load_weights(model, weights, lock, version, local: int) -> int:
    """Copy the shared weights into `model` when their version differs from the model's (`local`)."""
    if version.value == local:
        return local
    params = model.state_dict()
    with lock, torch.no_grad():
        for name, tensor in weights.items():
            if name not in params:
                raise KeyError(f"the policy's weight {name!r} has no place in the worker's model")
            params[name].copy_(tensor)
        return int(version.value)


@torch.no_grad()
def _generate(model, prompt_ids: Tensor, prompt_mask: Tensor, config: dict, seed: int) -> tuple[Tensor, ...]:
    from transformers import GenerationConfig, LogitsProcessorList

    from replayrl.generation.hf import generate_completions

    generation_config = GenerationConfig.from_dict(dict(config))
    recorder = SampledLogps(generation_config.temperature or 1.0)
    torch.manual_seed(seed)
    ids, mask, truncated = generate_completions(
        model, prompt_ids, prompt_mask, generation_config, logits_processor=LogitsProcessorList([recorder])
    )
    logps = recorder.finish(ids).masked_fill(mask == 0, float("nan"))
    return ids, mask, truncated, logps
