"""The asynchronous producer for a `replayrl vllm-serve` server: a thread that sends the trainer's generation batches to
the server one at a time, and makes the server reload the trainer's weights between two batches when newer ones were
pushed. Same interface as `async_worker.GenerationWorker` (submit / result / push_weights / close).

`push_weights` (the trainer's thread) only writes the weights to a new temporary folder (`save_weights`, the
synchronous server backend's format); the producer thread asks the server to reload them before its next request, so a
reload never runs during a generation and the trainer never waits for the server. The server's log-probs of its sampled
tokens come back as the engine's log-probs.
"""

from __future__ import annotations

import queue
import tempfile
import threading
import time
import traceback

from replayrl.generation.async_worker import POLL_SECONDS, GenerationWorkerError, WorkerResult
from replayrl.generation.vllm_server import VLLMServerBackend, save_weights


class ServerProducer:
    """A producer thread in front of a `VLLMServerBackend` (see the module docstring)."""

    def __init__(self, backend: VLLMServerBackend, version: int):
        self.backend = backend
        self._requests: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._pending: tuple[tempfile.TemporaryDirectory, int] | None = None  # weights not reloaded yet
        self._version, self._submitted, self._started = version, 0, 0
        self._thread = threading.Thread(target=self._run, daemon=True, name="replayrl-vllm-producer")
        self._thread.start()

    def push_weights(self, model, version: int, wait_for_start: bool = False) -> float:
        """Write `model`'s weights for the server to reload before its next batch. `wait_for_start`: first wait until
        the producer has begun every submitted batch (each is then sampled with the weights of its submission)."""
        start = time.perf_counter()
        while wait_for_start and self._started < self._submitted:
            self._check_alive()
            time.sleep(0.001)
        folder = tempfile.TemporaryDirectory(prefix="replayrl-async-sync-")
        save_weights(model, folder.name)
        with self._lock:
            replaced, self._pending = self._pending, (folder, version)
        if replaced is not None:  # never reloaded: a newer version supersedes it
            replaced[0].cleanup()
        return time.perf_counter() - start

    def claim_unstarted(self) -> list[WorkerResult]:
        """Nothing to claim: the server is up before training starts."""
        return []

    def submit(self, batch: int, prompt_ids, prompt_mask, seed: int) -> None:
        self._check_alive()
        self._requests.put((batch, prompt_ids.cpu(), prompt_mask.cpu()))
        self._submitted += 1

    def result(self) -> WorkerResult:
        while True:
            try:
                message = self._results.get(timeout=POLL_SECONDS)
            except queue.Empty:
                self._check_alive()
                continue
            if message[0] == "error":
                raise GenerationWorkerError(f"the vLLM producer failed: {message[1]}\n{message[2]}")
            return message[1]

    def _check_alive(self) -> None:
        if not self._thread.is_alive() and self._results.empty():
            raise GenerationWorkerError("the vLLM producer thread has stopped")

    def close(self, timeout: float = 60.0) -> None:
        """Stop the thread after the request it is in (at most `timeout` seconds), and remove unreloaded weights."""
        self._requests.put(None)
        self._thread.join(timeout)
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            pending[0].cleanup()

    # -------------------------------------------------------------------------------------------- the thread
    def _run(self) -> None:
        try:
            while (request := self._requests.get()) is not None:
                batch, prompt_ids, prompt_mask = request
                start = time.perf_counter()
                version = self._reload_if_newer()
                self._started += 1
                loaded = time.perf_counter()
                out = self.backend.generate(prompt_ids, prompt_mask)
                seconds = time.perf_counter() - loaded
                result = WorkerResult(
                    batch,
                    version,
                    out.completion_ids,
                    out.completion_mask,
                    out.truncated,
                    out.logps,
                    seconds,
                    loaded - start,
                )
                self._results.put(("ok", result))
        except BaseException as exc:  # noqa: BLE001 - the trainer must learn of every failure
            self._results.put(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))

    def _reload_if_newer(self) -> int:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            folder, version = pending
            try:
                self.backend.reload_from(folder.name)
            finally:
                folder.cleanup()
            self._version = version
        return self._version
