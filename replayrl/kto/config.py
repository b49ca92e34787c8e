"""`KTOConfig`: TRL 1.16's `KTOConfig`, every field with TRL's default, on `transformers.TrainingArguments`.

Fields that replayrl's KTO does not implement are refused at any value but the inactive one, with the reason:
`precompute_ref_log_probs` / `precompute_ref_batch_size` and a non-zero `router_aux_loss_coef` (Mixture-of-Experts
auxiliary loss).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replayrl.algos.kto import KTO_LOSSES, kto_loss_entry
from replayrl.training_args import TRLBaseArguments, resolve_pad_to_multiple_of


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class KTOConfig(TRLBaseArguments):
    r"""Configuration for [`KTOTrainer`] (TRL 1.16's names and defaults). Every field is also a
    `replayrl kto --<field>` flag."""

    train_sampling_strategy: str = field(
        default="sequential",
        metadata=_help("TRL's KTO default: the dataset's order (shuffle it first). 'random' works here too."),
    )
    # Model
    model_init_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata=_help("Keyword arguments for `from_pretrained` when `model` is a name or path.")
    )
    trust_remote_code: bool = field(default=False, metadata=_help("Allow models that ship custom code."))
    router_aux_loss_coef: float | None = field(
        default=None, metadata=_help("MoE auxiliary-loss coefficient; not supported here (leave None or 0).")
    )
    disable_dropout: bool = field(default=True, metadata=_help("Disable dropout in the policy and the reference."))
    # Data
    dataset_num_proc: int | None = field(default=None, metadata=_help("Processes for tokenising the dataset."))
    max_length: int | None = field(
        default=1024, metadata=_help("Maximum prompt + completion tokens; the end is cut (None: no limit).")
    )
    pad_to_multiple_of: int | str | None = field(
        default="auto", metadata=_help("Pad sequence widths to a multiple of this; 'auto': no padding off Neuron.")
    )
    precompute_ref_log_probs: bool = field(
        default=False, metadata=_help("Precompute the reference log-probs before training (not supported here).")
    )
    precompute_ref_batch_size: int | None = field(
        default=None, metadata=_help("Batch size of that precomputation (not supported here).")
    )
    # Loss
    loss_type: str = field(
        default="kto",
        metadata=_help(" or ".join(f"'{name}' ({loss.source})" for name, loss in KTO_LOSSES.items()) + "."),
    )
    beta: float = field(default=0.1, metadata=_help("Deviation from the reference: higher beta, less deviation."))
    desirable_weight: float = field(default=1.0, metadata=_help("Weight of the desirable examples' losses."))
    undesirable_weight: float = field(default=1.0, metadata=_help("Weight of the undesirable examples' losses."))
    activation_offloading: bool = field(
        default=False,
        metadata=_help("Keep the activations saved for backward in CPU memory during training (save_on_cpu)."),
    )
    sync_ref_model: bool = field(default=False, metadata=_help("TR-DPO: periodically mix the policy into the ref."))
    ref_model_mixup_alpha: float = field(default=0.6, metadata=_help("TR-DPO alpha: ref = a*policy + (1-a)*ref."))
    ref_model_sync_steps: int = field(default=512, metadata=_help("TR-DPO tau: sync every N optimizer steps."))

    def __post_init__(self):
        self.pad_to_multiple_of = resolve_pad_to_multiple_of(self.pad_to_multiple_of)
        if isinstance(self.model_init_kwargs, str):
            import json

            self.model_init_kwargs = json.loads(self.model_init_kwargs)
        super().__post_init__()
        self._validate()

    def _validate(self) -> None:
        refusals = [
            (self.precompute_ref_log_probs, "precompute_ref_log_probs=True is not implemented by replayrl's KTO"),
            (self.precompute_ref_batch_size is not None, "precompute_ref_batch_size is unused (no precomputation)"),
            (bool(self.router_aux_loss_coef), "router_aux_loss_coef: replayrl's KTO adds no MoE auxiliary loss"),
        ]
        for bad, reason in refusals:
            if bad:
                raise ValueError(f"{reason}; leave it at its default (the reference is scored on the fly).")
        kto_loss_entry(self.loss_type)  # ValueError naming the registry's loss types
        checks = [
            (self.beta > 0, f"beta must be > 0 (got {self.beta})."),
            (
                self.desirable_weight >= 0 and self.undesirable_weight >= 0,
                f"desirable_weight and undesirable_weight must be >= 0 (got {self.desirable_weight}, "
                f"{self.undesirable_weight}).",
            ),
            (self.max_length is None or self.max_length >= 2, f"max_length must be >= 2 or None ({self.max_length})."),
            (0 <= self.ref_model_mixup_alpha <= 1, "ref_model_mixup_alpha must be in [0, 1]."),
            (
                self.pad_to_multiple_of is None or self.pad_to_multiple_of >= 1,
                "pad_to_multiple_of must be >= 1, 'auto' or None.",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
