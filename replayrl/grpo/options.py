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


def router_aux_loss_settings(model: nn.Module, coef: float | None) -> tuple[bool, float]:
    """TRL's (`aux_loss_enabled`, `router_aux_loss_coef`): None takes the model config's own coefficient (0.0 when
    it declares none); a non-zero coefficient for a model without a router raises, as in TRL. Enabled: a
    mixture-of-experts model (its config has `output_router_logits`, whatever its value: the trainer asks for the
    router logits in the forward pass) with a non-zero coefficient."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    if coef and not hasattr(config, "output_router_logits"):
        raise ValueError(
            f"router_aux_loss_coef={coef} but {type(model).__name__} is not a Mixture-of-Experts model with a "
            "router, so there is no auxiliary loss to weight: leave router_aux_loss_coef unset (None)."
        )
    value = float((getattr(config, "router_aux_loss_coef", 0.0) if coef is None else coef) or 0.0)
    return hasattr(config, "output_router_logits") and value != 0.0, value


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
