"""Gradient accumulation decided by replayrl, not inherited from the installed transformers.

`transformers.Trainer.training_step` divides the loss by the number of accumulated micro-batches unless it
believes the loss is already scaled, and how it decides has changed across the versions replayrl supports:
before 5.19 it reads `model_accepts_loss_kwargs`, `num_items_in_batch` and `compute_loss_func`; from 5.19 a
`loss_is_scaled_for_ga` attribute overrides them. A trainer that relied on one of those rules trained with the
gradient divided by the accumulation steps once too often on another version (GRPO on transformers 5.17:
grad_norm 1.092 at 8x1, 0.137 at 1x8). Some versions (5.2) also create the `Accelerator` with
`gradient_accumulation_steps` set, and `Accelerator.backward` then divides by it a second time; others (5.0,
5.17, 5.24) set it to 1.

Every replayrl trainer built on `Trainer` therefore takes this mixin: its `compute_loss` returns this
micro-batch's share of the optimizer step's loss (`micro_batch_share` for a per-micro-batch mean), and
`training_step` back-propagates exactly that, with no further division (it undoes `Accelerator.backward`'s), on
every version. 8 micro-batches of 1
row then give the same update as 1 micro-batch of 8 rows.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor


def micro_batch_share(trainer, loss: Tensor, training: bool) -> Tensor:
    """`loss` (a mean over this micro-batch) as its share of the optimizer step: divided by the micro-batches the
    step accumulates (`current_gradient_accumulation_steps`, fewer for a short last step). Eval: unchanged."""
    return loss / trainer.current_gradient_accumulation_steps if training else loss


def activation_offloading(args):
    """TRL's `activation_offloading=True`: the tensors autograd saves in the training forward for the backward
    live in CPU memory (pinned when CUDA is there, for asynchronous copies) and come back to the device when the
    backward reads them (`torch.autograd.graph.save_on_cpu`). Same gradients, less accelerator memory, more host
    traffic. TRL uses its own offloading context manager for the same purpose. A no-op when the field is off or
    absent."""
    if not getattr(args, "activation_offloading", False):
        return nullcontext()
    return torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available())


class OwnLossScalingMixin:
    """`training_step` that back-propagates `compute_loss`'s value as is (see the module docstring).

    The rest follows `transformers.Trainer.training_step` (5.0 to 5.24): train mode for the model and for
    schedule-free optimizers, the compute-loss context (autocast), LOMO's learning rate, DeepSpeed told not to
    rescale, `torch_empty_cache_steps`; and `activation_offloading` (the config field of TRL's SFT/DPO/reward
    configs) around the forward. SageMaker model parallelism is not supported.
    """

    loss_is_scaled_for_ga = True  # read by transformers >= 5.19 elsewhere (e.g. logging); true by construction

    def training_step(self, model, inputs, num_items_in_batch=None) -> Tensor:
        from accelerate.utils import DistributedType
        from transformers.training_args import OptimizerNames

        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager(), activation_offloading(self.args):
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        del inputs
        empty_every = self.args.torch_empty_cache_steps
        if empty_every is not None and self.state.global_step % empty_every == 0:
            from accelerate.utils import clear_device_cache

            clear_device_cache()
        kwargs = {}
        if self.args.optim in (OptimizerNames.LOMO, OptimizerNames.ADALOMO):
            kwargs["learning_rate"] = self._get_learning_rate()
        if self.args.n_gpu > 1:
            loss = loss.mean()  # torch.nn.DataParallel: one loss per device
        scaled = loss
        if self.accelerator.distributed_type == DistributedType.DEEPSPEED:
            kwargs["scale_wrt_gas"] = False
        else:  # Accelerator.backward divides by its own accumulation steps (1 unless transformers set them)
            scaled = loss * self.accelerator.gradient_accumulation_steps
        self.accelerator.backward(scaled, **kwargs)
        return loss.detach()
