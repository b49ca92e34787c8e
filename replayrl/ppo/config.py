"""`PPOConfig`: TRL v0.7.1's fields and defaults, validated once with fix-it errors.

Beyond TRL v0.7.1: `output_dir` (metrics.jsonl, checkpoints and the final model of `PPOTrainer.train()`),
`save_steps`, `logging_steps` and `temperature` (the sampling temperature the policy's log-probs are computed
at, arXiv:2403.17031 detail "scale the logits by the sampling temperature") and `ds3_gather_for_generation`
(under DeepSpeed ZeRO-3: gather the policy's weights once per `generate` call, as TRL's later trainers; False:
keep them partitioned, fetched layer by layer at every decoding step, `docs/distributed.md`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Literal


@dataclass
class PPOConfig:
    """Configuration of `PPOTrainer` (TRL v0.7.1's `PPOConfig`). `batch_size` is per process."""

    task_name: str | None = None
    model_name: str | None = None
    steps: int = 20000
    learning_rate: float = 1e-5
    adap_kl_ctrl: bool = True
    init_kl_coef: float = 0.2
    kl_penalty: Literal["kl", "abs", "mse", "full"] = "kl"
    target: float = 6
    horizon: float = 10000
    gamma: float = 1
    lam: float = 0.95
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    batch_size: int = 256
    forward_batch_size: int | None = None
    mini_batch_size: int = 1
    backward_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    ppo_epochs: int = 4
    remove_unused_columns: bool = True
    log_with: str | None = None
    tracker_kwargs: dict = field(default_factory=dict)
    accelerator_kwargs: dict = field(default_factory=dict)
    project_kwargs: dict = field(default_factory=dict)
    tracker_project_name: str = "trl"
    max_grad_norm: float | None = None
    seed: int = 0
    optimize_cuda_cache: bool = False
    early_stopping: bool = False
    target_kl: float = 0.1
    push_to_hub_if_best_kwargs: dict = field(default_factory=dict)
    compare_steps: int = 1
    ratio_threshold: float = 10.0
    use_score_scaling: bool = False
    use_score_norm: bool = False
    score_clip: float | None = None
    # ---- beyond TRL v0.7.1
    output_dir: str | None = None
    save_steps: int | None = None
    logging_steps: int = 1
    temperature: float = 1.0
    ds3_gather_for_generation: bool = True

    def __post_init__(self):
        if self.forward_batch_size is not None:
            warnings.warn(
                "forward_batch_size is deprecated (as in TRL v0.7.1); use mini_batch_size. Setting mini_batch_size "
                f"= {self.forward_batch_size}.",
                FutureWarning,
                stacklevel=3,
            )
            self.mini_batch_size = self.forward_batch_size
        self._check_positive()
        self._check_ranges()
        self.backward_batch_size = self.mini_batch_size * self.gradient_accumulation_steps
        if self.batch_size % self.backward_batch_size != 0:
            raise ValueError(
                f"batch_size={self.batch_size} is not divisible by mini_batch_size * gradient_accumulation_steps "
                f"= {self.mini_batch_size} * {self.gradient_accumulation_steps} = {self.backward_batch_size}; "
                "change one of them so that it is (e.g. batch_size a multiple of the product)."
            )
        self.total_ppo_epochs = math.ceil(self.steps / self.batch_size)

    def _check_positive(self) -> None:
        for name in ("steps", "batch_size", "mini_batch_size", "gradient_accumulation_steps", "ppo_epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer.")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate={self.learning_rate} must be > 0.")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature} must be > 0.")
        if not self.logging_steps >= 1:
            raise ValueError(f"logging_steps={self.logging_steps} must be >= 1.")
        if self.save_steps is not None and self.save_steps < 1:
            raise ValueError(f"save_steps={self.save_steps} must be >= 1, or None for no checkpoints.")
        for name in ("horizon", "target", "target_kl", "ratio_threshold"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0.")

    def _check_ranges(self) -> None:
        if self.kl_penalty not in ("kl", "abs", "mse", "full"):
            raise ValueError(f"kl_penalty={self.kl_penalty!r}: choose one of 'kl', 'abs', 'mse', 'full'.")
        for name in ("gamma", "lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name}={getattr(self, name)} must be in [0, 1].")
        for name in ("cliprange", "cliprange_value", "vf_coef", "init_kl_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0.")
        if self.score_clip is not None and not self.score_clip > 0:
            raise ValueError(f"score_clip={self.score_clip} must be > 0 (or None for no clipping).")
        if self.use_score_norm and not self.use_score_scaling:
            raise ValueError(
                "use_score_norm=True only applies with use_score_scaling=True (it subtracts the running mean "
                "before dividing by the running std); set use_score_scaling=True or use_score_norm=False."
            )
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm={self.max_grad_norm} must be > 0 (or None for no clipping).")
