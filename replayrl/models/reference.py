"""Reference models: the context that yields the model playing the reference, TR-DPO's sync of the reference
towards the policy (arXiv:2404.09656) and its checkpoint state, shared by the trainers with a separate reference."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import TrainerCallback

from replayrl.models.attention import is_peft_model
from replayrl.models.peft_reference import reference_adapter
from replayrl.models.sharding import (
    full_state_dict,
    gathered_parameters,
    is_dtensor,
    load_full_state_dict,
    prepare_frozen_model,
)


class SyncRefModelCallback(TrainerCallback):
    """TR-DPO (arXiv:2404.09656): every `ref_model_sync_steps`, ref <- alpha * policy + (1 - alpha) * ref."""

    def __init__(self, trainer):
        self.trainer = trainer

    @torch.no_grad()
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.ref_model_sync_steps != 0:
            return
        unwrap = self.trainer.accelerator.unwrap_model
        alpha = args.ref_model_mixup_alpha
        refs, policy = list(unwrap(self.trainer.ref_model).parameters()), list(unwrap(self.trainer.model).parameters())
        # ZeRO-3: whole on every process inside; the reference's new values are partitioned again from rank 0's
        with gathered_parameters(policy), gathered_parameters(refs, modifier_rank=0):
            for ref, pol in zip(refs, policy):
                if is_dtensor(pol) and not is_dtensor(ref):  # FSDP2 shards the policy, not the evaluated reference
                    pol = pol.full_tensor()
                ref.mul_(1 - alpha).add_(pol.detach(), alpha=alpha)


def check_ref_sync(args, ref_model) -> None:
    """Before any expensive work: TR-DPO moves a separate reference, which PEFT (adapter disabled) does not have."""
    if args.sync_ref_model and ref_model is None:
        raise ValueError("sync_ref_model=True needs a separate reference model; it cannot be used with PEFT.")


class ReferenceModelMixin:
    """For a `transformers.Trainer` with `self.ref_model` (None: the policy plays the reference, with its PEFT
    adapter disabled): `_set_ref_model` after `Trainer.__init__`, the `_reference()` context, and TR-DPO's moving
    reference in the checkpoint (`SafeCheckpointsMixin`'s `_extra_state` hooks: list this mixin before it)."""

    def _set_ref_model(self, ref_model) -> None:
        """Prepare the reference for evaluation and, with `sync_ref_model`, attach TR-DPO's sync."""
        self.ref_model = ref_model
        if ref_model is not None:
            self.ref_model = prepare_frozen_model(ref_model, self.accelerator)
        check_ref_sync(self.args, self.ref_model)
        if self.args.sync_ref_model:
            self.add_callback(SyncRefModelCallback(self))

    @contextmanager
    def _reference(self) -> Iterator:
        """Yields the model that plays the reference: the ref model, the PEFT policy with its frozen "ref" adapter
        (a passed PeftModel, `models.peft_reference`) or its adapters disabled (`peft_config`), or the policy itself
        (DPO precomputing reference log-probs before any update)."""
        if self.ref_model is not None:
            yield self.ref_model
            return
        policy = self.accelerator.unwrap_model(self.model)
        if is_peft_model(policy):
            with reference_adapter(policy):
                yield policy
        else:
            yield self.model

    def _extra_state(self) -> dict:
        """TR-DPO's reference changes during training: it goes into the checkpoint."""
        if not self.args.sync_ref_model:
            return {}
        return {"ref_model": full_state_dict(self.accelerator.unwrap_model(self.ref_model))}

    def _load_extra_state(self, state: dict) -> None:
        if self.args.sync_ref_model:
            if "ref_model" not in state:
                raise ValueError("The checkpoint was not saved with sync_ref_model=True: it has no TR-DPO reference.")
            load_full_state_dict(self.accelerator.unwrap_model(self.ref_model), state["ref_model"])
