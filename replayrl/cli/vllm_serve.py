"""`replayrl vllm-serve --model MODEL [--host 127.0.0.1] [--port 8000] ...`: a vLLM server to train against.

Train against it with `GRPOConfig(use_vllm=True, vllm_mode="server", vllm_server_port=...)`. The server exposes
endpoints that replace the model's weights (that is how training syncs them), so it listens on loopback unless
--host says otherwise. Arguments after `--` go to vLLM's server unchanged. Ctrl-C or SIGTERM shuts it down.
"""

from __future__ import annotations

import importlib.util
import signal
import sys

from replayrl.cli.common import PROG, ArgParser, CLIError, HelpFormatter


def _parser() -> ArgParser:
    parser = ArgParser(
        prog=f"{PROG} vllm-serve", description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--model", required=True, help="model to serve: a local folder or a hub name")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes weight replacement)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--tensor_parallel_size", type=int, default=1, help="GPUs to shard the model over")
    parser.add_argument("--gpu_memory_utilization", type=float, default=None, help="GPU memory share for vLLM")
    parser.add_argument("--dtype", default="auto", help="weights dtype (auto, float32, bfloat16, float16)")
    parser.add_argument("--max_model_len", type=int, default=None, help="context length (default: the model's)")
    parser.add_argument("--kv_cache_gib", type=int, default=None, help="CPU only: KV-cache size in GiB (default 1)")
    parser.add_argument("--startup_timeout", type=float, default=900.0, help="seconds to wait for the server")
    return parser


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
    args = _parser().parse_args(own)
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
