"""`replayrl vllm-serve --model MODEL [--host 127.0.0.1] [--port 8000] ...`: a vLLM server to train against.

Train against it with `GRPOConfig(use_vllm=True, vllm_mode="server", vllm_server_port=...)`. The server exposes
endpoints that replace the model's weights (that is how training syncs them), so it listens on loopback unless
--host says otherwise. Arguments after `--` go to vLLM's server unchanged. Ctrl-C or SIGTERM shuts it down.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
from dataclasses import dataclass, field

from replayrl.cli.common import PROG, CLIError, make_parser
from replayrl.cli.common import help_text as _help


@dataclass
class VLLMServeArguments:
    """The server's flags (TRL's `trl vllm-serve` names where it has them); arguments after `--` go to vLLM."""

    _argument_group_name = "server"

    model: str = field(metadata=_help("Model to serve: a local folder or a hub name."))
    host: str = field(default="127.0.0.1", metadata=_help("Address to bind (0.0.0.0 exposes weight replacement)."))
    port: int = field(default=8000, metadata=_help("Port to listen on."))
    tensor_parallel_size: int = field(default=1, metadata=_help("GPUs to shard the model over."))
    gpu_memory_utilization: float | None = field(default=None, metadata=_help("GPU memory share for vLLM."))
    dtype: str = field(default="auto", metadata=_help("Weights dtype (auto, float32, bfloat16, float16)."))
    max_model_len: int | None = field(default=None, metadata=_help("Context length (default: the model's)."))
    kv_cache_gib: int | None = field(default=None, metadata=_help("CPU only: KV-cache size in GiB (default 1)."))
    startup_timeout: float = field(default=900.0, metadata=_help("Seconds to wait for the server."))


def _parse(argv: list[str]) -> VLLMServeArguments:
    usage = f"{PROG} vllm-serve [-h] --model MODEL [--<flag> VALUE ...] [-- VLLM_ARGS ...]"
    parser = make_parser("vllm-serve", (VLLMServeArguments,), description=__doc__, usage=usage)
    args, remaining = parser.parse_args_into_dataclasses(argv, return_remaining_strings=True, look_for_args_file=False)
    if remaining:
        raise CLIError(f"unrecognized arguments: {' '.join(remaining)} (vLLM's own go after `--`)")
    return args


def _vllm_args(args) -> list[str]:
    extra = ["--dtype", args.dtype]
    if args.gpu_memory_utilization is not None:
        extra += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if args.max_model_len is not None:
        extra += ["--max-model-len", str(args.max_model_len)]
    return extra


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def run(argv: list[str]) -> int:
    own, passthrough = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = _parse(own)
    if not 0 < args.port < 65536:
        raise CLIError(f"--port must be in 1..65535 (got {args.port})")
    if importlib.util.find_spec("vllm") is None:
        from replayrl.generation.base import VLLM_INSTALL

        raise CLIError(f"vLLM is not installed: {VLLM_INSTALL}")
    from replayrl.generation.vllm_serve import VLLMServer, server_command

    command = server_command(
        args.model, args.host, args.port, args.tensor_parallel_size, _vllm_args(args) + passthrough
    )
    env = None
    if args.kv_cache_gib is not None:
        import os

        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(args.kv_cache_gib))
    host = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
    server = VLLMServer(command, f"http://{host}:{args.port}", env=env)
    # SIGTERM -> KeyboardInterrupt, so both paths run the same clean shutdown
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.start(timeout=args.startup_timeout)
        from replayrl.generation.vllm_server import server_info

        dtype = server_info(server.base_url).get("dtype", "unknown")
        url = f"http://{args.host}:{args.port}"
        print(f"{PROG} vllm-serve: ready at {url} (model {args.model}, runs in {dtype}; --dtype {args.dtype})")
        sys.stdout.flush()
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
