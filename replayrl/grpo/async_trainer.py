"""TRL's `trl.experimental.async_grpo` API over replayrl's asynchronous GRPO (docs/async.md).

`AsyncGRPOConfig` is a `GRPOConfig` with `async_generation=True` and the defaults of TRL's `AsyncGRPOConfig` where
they differ from GRPO's; `AsyncGRPOTrainer` is a `GRPOTrainer` that builds that config when none is given. The
pipeline fields (`max_staleness`, `weight_sync_steps`, `max_inflight_tasks`, `queue_maxsize`) are GRPOConfig's own,
so the same fields switch it on in `GRPOTrainer`, `GRPOWithReplayBufferTrainer` and `RLOOTrainer`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replayrl.grpo.config import GRPOConfig
from replayrl.grpo.trainer import GRPOTrainer


@dataclass
class AsyncGRPOConfig(GRPOConfig):
    """`GRPOConfig` with asynchronous generation on and TRL's `AsyncGRPOConfig` defaults (docs/async.md)."""

    async_generation: bool = field(default=True, metadata={"help": "Generate ahead in a worker process (default on)."})
    max_completion_length: int | None = field(default=2048, metadata={"help": "TRL AsyncGRPOConfig's default."})
    epsilon_high: float | None = field(default=0.2, metadata={"help": "TRL AsyncGRPOConfig's default."})
    logging_steps: float = field(default=1, metadata={"help": "TRL AsyncGRPOConfig's default."})
    vllm_server_timeout: float = field(default=240.0, metadata={"help": "TRL AsyncGRPOConfig's default."})
    request_timeout: int = field(
        default=600, metadata={"help": "TRL's timeout of one request to the vLLM server (unused: no vLLM backend yet)."}
    )


class AsyncGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` with asynchronous generation: arguments as TRL's `AsyncGRPOTrainer` (and `GRPOTrainer`)."""

    _tag_names = ["trl", "async-grpo", "replayrl"]

    @staticmethod
    def _default_config(output_dir: str) -> AsyncGRPOConfig:
        return AsyncGRPOConfig(output_dir=output_dir)
