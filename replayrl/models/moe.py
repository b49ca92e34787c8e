"""MoE router auxiliary loss for the SFT and DPO trainers (TRL's `aux_loss_enabled` / `router_aux_loss_coef`).

The router logits are captured with forward hooks on the model's router modules (the ones transformers records
as `router_logits`), and the loss is `algos.moe.load_balancing_loss` over a token mask the trainer gives: the
model's own aux loss is not used, since it reads the attention mask and breaks on 4-D (packed, prefix-shared)
masks (seen with transformers 5.17: a mask of 4 rows against 48 routed tokens).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor, nn

from replayrl.algos.moe import load_balancing_loss


def router_aux_settings(model: nn.Module, coef: float | None) -> tuple[bool, float]:
    """TRL's rule: (enabled, coefficient). None takes the model config's `router_aux_loss_coef` (0.0 when it
    declares none); a non-zero coefficient for a model without a router raises."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    is_moe = hasattr(config, "output_router_logits")
    value = getattr(config, "router_aux_loss_coef", 0.0) if coef is None else coef
    if coef and not is_moe:
        raise ValueError(
            f"router_aux_loss_coef={coef} but {type(model).__name__} is not a Mixture-of-Experts model with a "
            "router, so there is no auxiliary loss to weight: leave router_aux_loss_coef unset (None)."
        )
    return is_moe and value != 0.0, float(value or 0.0)


def _router_class(model: nn.Module):
    for module in model.modules():
        recorder = (getattr(module, "_can_record_outputs", None) or {}).get("router_logits")
        if recorder is not None:
            return getattr(recorder, "target_class", recorder), getattr(recorder, "index", 0)
    return None, 0


class RouterLogits:
    """``with RouterLogits(model) as routers: model(...)``; then ``routers.aux_loss(token_mask, top_k)``."""

    def __init__(self, model: nn.Module):
        cls, self.index = _router_class(model)
        if cls is None:
            raise ValueError(
                f"{type(model).__name__} declares no router modules (transformers' `router_logits` recorder), so its "
                "router logits cannot be captured: set router_aux_loss_coef=0.0 to train without the aux loss."
            )
        self.modules = [m for m in model.modules() if isinstance(m, cls)]
        self.logits: list[Tensor] = []
        self._handles = []

    def _hook(self, module, args, output) -> None:
        self.logits.append(output[self.index] if isinstance(output, tuple) else output)

    def __enter__(self) -> RouterLogits:
        self.logits = []
        self._handles = [m.register_forward_hook(self._hook) for m in self.modules]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def aux_loss(self, token_mask: Tensor | None, top_k: int) -> Tensor:
        """The load-balancing loss of the captured forward pass; token_mask (B, T) or (N,), 1 = real token.

        A (B, T) mask of rows that routed more than T tokens each gets 1s in front: the virtual tokens a
        prompt-learning adapter (prompt tuning, p-tuning) prepends are routed too, and PEFT's own forward counts
        them (it prepends 1s to the attention mask the model's aux loss reads)."""
        if token_mask is not None and token_mask.dim() == 2 and self.logits:
            rows, routed = token_mask.shape[0], self.logits[0].shape[0]
            extra = routed // rows - token_mask.shape[1]
            if extra > 0 and routed % rows == 0:
                token_mask = torch.cat([token_mask.new_ones(rows, extra), token_mask], dim=1)
        return load_balancing_loss(self.logits, top_k, token_mask)


class RouterAuxLossMixin:
    """A trainer's TRL-style `aux_loss_enabled` / `router_aux_loss_coef` and the logged `aux_loss`."""

    _routers: RouterLogits | None = None

    def _init_router_aux(self, model: nn.Module, coef: float | None) -> None:
        self.aux_loss_enabled, self.router_aux_loss_coef = router_aux_settings(model, coef)
        self._routers = RouterLogits(model) if self.aux_loss_enabled else None
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self._router_top_k = int(getattr(config, "num_experts_per_tok", 1) or 1)
        self._aux_sums: dict[str, Tensor] = {}
        if self.aux_loss_enabled:  # computed here from the captured logits; the model's own reads the attention mask
            config.output_router_logits = False

    def _router_capture(self):
        return self._routers if self._routers is not None else nullcontext()

    def _add_router_aux(self, loss: Tensor, mode: str, token_mask: Tensor | None, steps: int = 1) -> Tensor:
        """``loss + router_aux_loss_coef * aux / steps`` for the forward pass just captured (no-op when off);
        steps: the accumulation steps the caller's loss is already divided by."""
        if self._routers is None:
            return loss
        aux = self._routers.aux_loss(token_mask, self._router_top_k).to(loss.device)
        entry = torch.stack([aux.detach(), torch.ones_like(aux)])
        self._aux_sums[mode] = entry if mode not in self._aux_sums else self._aux_sums[mode] + entry
        return loss + self.router_aux_loss_coef * aux / steps

    def _router_aux_logs(self, mode: str, device) -> dict[str, float]:
        """{"aux_loss": mean over the logging window and processes}; every process calls it at the same points."""
        if self._routers is None:
            return {}
        window = self._aux_sums.pop(mode, None)
        local = window.to(device) if window is not None else torch.zeros(2, device=device)
        total, count = self.accelerator.reduce(local, reduction="sum").tolist()
        return {"aux_loss": total / count} if count else {}
