"""Model options of `GRPOTrainer` that current TRL offers (fp32 LM head, MoE router loss detection) and
fixed-multiple padding. Plain functions, called from the trainer."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def cast_lm_head_to_fp32(model: nn.Module) -> None:
    """Run the LM head in float32 (ScaleRL, arXiv:2510.13786): its weights become fp32 and its input is cast up,
    so the logits (and the log-probs of the loss) are computed in fp32. With tied embeddings (as TRL 1.16) the
    shared weight becomes fp32 too and the input embedding's output is cast back to the model's dtype, so only
    the head runs in fp32."""
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError("cast_lm_head_to_fp32=True: the model has no output embedding (LM head) to cast.")
    dtype = head.weight.dtype
    head.float()
    head.register_forward_pre_hook(lambda _module, inputs: tuple(x.float() for x in inputs))
    if getattr(model.config, "tie_word_embeddings", False):
        model.get_input_embeddings().register_forward_hook(lambda _module, _inputs, output: output.to(dtype))


def router_aux_loss_enabled(model: nn.Module) -> bool:
    """TRL's `aux_loss_enabled`: a mixture-of-experts model whose config asks for router logits."""
    return bool(getattr(getattr(model, "config", None), "output_router_logits", False))


def pad_width_to_multiple(
    ids: Tensor, mask: Tensor, multiple: int | None, side: str, pad_id: int
) -> tuple[Tensor, Tensor]:
    """Pad ``ids, mask (N, W)`` on ``side`` so that W is a multiple of ``multiple`` (None: unchanged)."""
    width = ids.shape[1]
    if not multiple or width % multiple == 0:
        return ids, mask
    extra = multiple - width % multiple
    pad_ids = torch.full((ids.shape[0], extra), pad_id, dtype=ids.dtype, device=ids.device)
    pad_mask = torch.zeros((mask.shape[0], extra), dtype=mask.dtype, device=mask.device)
    if side == "left":
        return torch.cat([pad_ids, ids], 1), torch.cat([pad_mask, mask], 1)
    return torch.cat([ids, pad_ids], 1), torch.cat([mask, pad_mask], 1)
