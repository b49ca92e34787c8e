"""Server-mode pieces that need no vLLM: an unreachable server is a quick, clear error (not a hang), the server
command line binds loopback with replayrl's worker extension, the weight file dedups a tied lm_head, and the
CLI's own errors."""

import importlib.util
import time

import pytest
import torch
from safetensors.torch import load_file

from replayrl.cli import main
from replayrl.generation.vllm_colocate import free_port
from replayrl.generation.vllm_serve import server_command, server_env
from replayrl.generation.vllm_server import ServerError, save_weights, server_url, wait_for_server
from replayrl.grpo import GRPOConfig


def test_unreachable_server_is_a_clear_error_not_a_hang():
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(ServerError, match="replayrl vllm-serve") as err:
        wait_for_server(url, timeout=1.0)
    assert time.monotonic() - start < 10
    assert url in str(err.value)


def test_server_url_from_config(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), vllm_server_port=8123)
    assert server_url(args) == "http://127.0.0.1:8123"  # TRL's default host 0.0.0.0 means this machine
    args.vllm_server_base_url = "http://gen-node:9000/"
    assert server_url(args) == "http://gen-node:9000"


def test_server_command_binds_loopback_with_worker_extension():
    command = server_command("/models/tiny")
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--worker-extension-cls") + 1].endswith("vllm_worker.ReplayRLWorkerExtension")
    env = server_env({})
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_weight_file_writes_a_tied_lm_head_once(tmp_path, model):
    assert model.lm_head.weight is model.get_input_embeddings().weight
    save_weights(model, str(tmp_path))
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert "lm_head.weight" not in saved
    state = model.state_dict()
    assert all(torch.equal(saved[k], state[k]) for k in saved)
    assert len(saved) == len(state) - 1


def test_cli_vllm_serve_errors(capsys):
    assert main(["vllm-serve", "--model", "m", "--port", "0"]) == 2
    assert "--port" in capsys.readouterr().err
    assert main(["vllm-serve"]) == 2
    assert "--model" in capsys.readouterr().err
    assert main(["vllm-serve", "--model", "m", "--enforce-eager"]) == 2  # vLLM's own flags go after `--`
    assert "unrecognized arguments: --enforce-eager" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_cli_vllm_serve_without_vllm_names_the_extra(capsys):
    assert main(["vllm-serve", "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "pip install replayrl[vllm]" in err and err.count("\n") == 1


def test_server_dtype_is_asked_of_the_workers_and_a_mismatch_is_explained(model, tmp_path):
    """The client side of `replayrl_info` against an HTTP server answering `/collective_rpc` as vLLM's dev endpoint
    does ({"results": [one value per worker]}); the worker side on a module standing in for the loaded model."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from types import SimpleNamespace

    from replayrl.generation.vllm_server import dtype_mismatch, server_info, trainer_dtype
    from replayrl.generation.vllm_worker import INFO_METHOD, ReplayRLWorkerExtension

    worker = ReplayRLWorkerExtension()
    worker.model_runner = SimpleNamespace(model=model.to(torch.bfloat16))
    calls = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(body)
            payload = json.dumps({"results": [getattr(worker, body["method"])()]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert server_info(f"http://127.0.0.1:{server.server_port}") == {"dtype": "bfloat16"}
    finally:
        server.shutdown()
    assert calls == [{"method": INFO_METHOD}]
    assert server_info(f"http://127.0.0.1:{free_port()}", timeout=2.0) == {}  # no server: nothing known
    args = GRPOConfig(output_dir=str(tmp_path))
    assert trainer_dtype(args, model.float()) == "float32"
    args.bf16 = True
    assert trainer_dtype(args, model) == "bfloat16"
    assert dtype_mismatch("bfloat16", "bfloat16") is None and dtype_mismatch(None, "float32") is None
    assert "--dtype float32" in dtype_mismatch("bfloat16", "float32")
