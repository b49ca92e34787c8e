"""Start and stop a vLLM server that replayrl can train against (`replayrl vllm-serve`, and tests).

The server is vLLM's OpenAI-compatible API server (`python -m vllm.entrypoints.openai.api_server`; the `vllm
serve` console script fails in the CPU wheel) with replayrl's worker extension for weight reloads and vLLM's
development endpoints (`/collective_rpc`, `/reset_prefix_cache`) switched on. Those endpoints let a client
replace the model's weights, so the server binds to loopback unless told otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from replayrl.generation.vllm_server import wait_for_server
from replayrl.generation.vllm_worker import WORKER_EXTENSION

DEFAULT_CPU_KV_CACHE_GIB = "1"


def server_command(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    tensor_parallel_size: int = 1,
    extra_args: list[str] | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The command line of a vLLM server for replayrl (eager mode and processed log-probs, as colocate uses)."""
    return [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        host,
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(tensor_parallel_size),
        "--worker-extension-cls",
        WORKER_EXTENSION,
        "--logprobs-mode",
        "processed_logprobs",
        "--enforce-eager",
        *(extra_args or []),
    ]


def server_env(base: dict | None = None) -> dict:
    """Environment for the server: development endpoints on; on CPU a bounded KV cache (1 GiB unless
    VLLM_CPU_KVCACHE_SPACE is set; unbounded, vLLM's CPU worker reserves ~16 GiB)."""
    env = dict(os.environ if base is None else base)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KV_CACHE_GIB)
    return env


class VLLMServer:
    """A vLLM server child process: `start()` returns once `/health` answers; `stop()` shuts it down (SIGTERM to
    its own process group, SIGKILL after `grace` seconds). Also a context manager."""

    def __init__(self, command: list[str], base_url: str, log_path: str | None = None, env: dict | None = None):
        self.command = command
        self.base_url = base_url
        self.log_path = log_path
        self.env = server_env(env)
        self.process: subprocess.Popen | None = None
        self._log = None

    def start(self, timeout: float = 600.0) -> VLLMServer:
        self._log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            self.command, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_for_server(self.base_url, timeout, self.process)
        except BaseException:
            self.stop()
            raise
        return self

    def wait(self) -> int:
        return self.process.wait()

    def stop(self, grace: float = 30.0) -> int | None:
        """Terminate the server (and the engine processes it started) and return its exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)  # the group we created for this server only
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.process.returncode

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False
