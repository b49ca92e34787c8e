"""Lean RMSNorm and SwiGLU MLP layers: the same forward, fewer tensors kept for the backward pass.

With the 152k vocabulary's logits chunked away (`replayrl.algos.logprobs`), what a training step holds at full
scale is the decoder's activations. Two layer types keep more of them than their gradients need:

- **RMSNorm** (Llama/Qwen/Mistral form, ``y = w * (x / rms(x))`` with the normalisation in float32): autograd keeps
  the float32 copy of ``x`` (4 bytes per element) and the normalised bf16 ``x`` for the weight's gradient. Kept
  here: ``x`` in its own dtype and one float32 ``rstd = 1 / rms(x)`` per position; the rest is recomputed.
  ``dx = rstd * (g - xhat * mean(g * xhat))`` with ``g = dy * w`` and ``xhat = x * rstd``; ``dw = sum(dy * xhat)``.
- **SwiGLU MLP** (``down(silu(gate(x)) * up(x))``): autograd keeps ``x``, ``gate(x)``, ``silu(gate(x))``,
  ``up(x)`` and the product, four tensors of the intermediate width. Kept here: ``x``, ``a = gate(x)`` and
  ``b = up(x)``; ``silu(a)`` and ``silu(a) * b`` are recomputed in backward (element-wise, no matrix product).

On a Qwen2-0.5B shape (hidden 896, intermediate 4864) that is about 26 KB fewer per token and layer in bf16, a
third of the decoder's activations. The forward runs the very operations of the transformers modules (same values,
bit for bit); the gradients agree to rounding. `make_layers_lean` patches a model's eligible modules in place
(`forward` of the instance); modules it cannot prove equal (other activations, biases, LoRA-wrapped or sharded
weights, unknown families) keep their own forward. Without gradients (generation, reference models) the modules'
own forward runs.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from replayrl.models.attention import base_model

# Families whose RMSNorm is ``weight * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype)`` and whose MLP is
# ``down(silu(gate(x)) * up(x))`` when ``hidden_act`` is "silu" (Gemma's norm scales by 1 + weight: not here).
LEAN_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral", "olmo2"})


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        h = x.to(torch.float32)
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        out = weight * (h * rstd).to(x.dtype)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.to(torch.float32) * rstd
        normed = xhat.to(x.dtype)
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = (grad_out * normed).reshape(-1, weight.shape[-1]).sum(0).to(weight.dtype)
        g = (grad_out * weight).to(x.dtype).to(torch.float32)
        grad_x = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> Tensor:
        device_type = x.device.type
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
        with torch.autocast(device_type, enabled=False):  # autocast's casts, made explicit (and kept for backward)
            xc = x.to(dtype)
            a, b = F.linear(xc, w_gate.to(dtype)), F.linear(xc, w_up.to(dtype))
            out = F.linear(F.silu(a) * b, w_down.to(dtype))
        ctx.save_for_backward(xc, a, b, w_gate, w_up, w_down)
        ctx.x_dtype = x.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        xc, a, b, w_gate, w_up, w_down = ctx.saved_tensors
        dtype = a.dtype
        with torch.autocast(grad_out.device.type, enabled=False):
            grad_out = grad_out.to(dtype)
            s = F.silu(a)
            grad_p = grad_out @ w_down.to(dtype)
            grad_b = grad_p * s
            grad_a = torch.ops.aten.silu_backward(grad_p * b, a)
            # two casts of x in autocast's forward: their gradients meet in x's dtype
            grad_x = (grad_a @ w_gate.to(dtype)).to(ctx.x_dtype) + (grad_b @ w_up.to(dtype)).to(ctx.x_dtype)
            flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
            grads = [None, None, None, None]
            if ctx.needs_input_grad[3]:
                grads[3] = (flat(grad_out).T @ flat(s * b)).to(w_down.dtype)
            if ctx.needs_input_grad[1]:
                grads[1] = (flat(grad_a).T @ flat(xc)).to(w_gate.dtype)
            if ctx.needs_input_grad[2]:
                grads[2] = (flat(grad_b).T @ flat(xc)).to(w_up.dtype)
        grads[0] = grad_x if ctx.needs_input_grad[0] else None
        return tuple(grads)


def _lean_norm_forward(self, hidden_states: Tensor) -> Tensor:
    if not torch.is_grad_enabled():
        return type(self).forward(self, hidden_states)
    return _RMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)


def _lean_mlp_forward(self, x: Tensor) -> Tensor:
    if not torch.is_grad_enabled():
        return type(self).forward(self, x)
    return _SwiGLU.apply(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)


def _plain_weight(param) -> bool:
    """A dense, unsharded parameter (not a ZeRO-3 placeholder, an FSDP2 DTensor or a quantized weight)."""
    return (
        isinstance(param, nn.Parameter)
        and type(param.data) is torch.Tensor
        and not hasattr(param, "ds_id")
        and param.dtype.is_floating_point
    )


def _is_norm(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(getattr(module, "variance_epsilon", None), float)
        and _plain_weight(weight)
        and weight.dim() == 1
    )


def _is_swiglu(module: nn.Module) -> bool:
    parts = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    return (
        type(module).__name__.endswith("MLP")
        and all(type(p) is nn.Linear and p.bias is None and _plain_weight(p.weight) for p in parts)
        and type(getattr(module, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation")
    )


def make_layers_lean(model: nn.Module) -> int:
    """Give ``model``'s RMSNorm and SwiGLU MLP modules the lean forward (in place); the number patched (0 for a
    family outside `LEAN_MODEL_TYPES`). Safe to call again."""
    base = base_model(model)
    if hasattr(base, "pretrained_model") and hasattr(base, "v_head"):  # value-head wrapper: the LM inside it
        base = base_model(base.pretrained_model)
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in LEAN_MODEL_TYPES or getattr(config, "hidden_act", "silu") != "silu":
        return 0
    patched = 0
    for module in base.modules():
        if "forward" in vars(module):  # patched already, or a forward someone else set on the instance
            patched += getattr(module, "_replayrl_lean", False)
            continue
        lean = _lean_norm_forward if _is_norm(module) else _lean_mlp_forward if _is_swiglu(module) else None
        if lean is not None:
            module.forward = types.MethodType(lean, module)
            module._replayrl_lean = True
            patched += 1
    return patched


def make_layers_plain(model: nn.Module) -> int:
    """Undo `make_layers_lean`: the modules' own forward again; the number restored."""
    restored = 0
    for module in model.modules():
        if getattr(module, "_replayrl_lean", False):
            del module.forward, module._replayrl_lean
            restored += 1
    return restored


def set_lean_layers(model: nn.Module, lean: bool) -> int:
    """`make_layers_lean` or `make_layers_plain` as the config's ``memory_efficient_layers`` says (the `train()`
    of every trainer built on transformers' Trainer calls this on its model)."""
    return make_layers_lean(model) if lean else make_layers_plain(model)
