"""Reference models: TR-DPO's sync of the reference towards the policy (arXiv:2404.09656)."""

from __future__ import annotations

import torch
from transformers import TrainerCallback


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
        for ref, pol in zip(unwrap(self.trainer.ref_model).parameters(), unwrap(self.trainer.model).parameters()):
            ref.mul_(1 - alpha).add_(pol.detach(), alpha=alpha)
