"""The mixture-of-experts router load-balancing loss (Switch Transformer, arXiv:2101.03961, eqs. 4-6), pure math.

With E experts and top-k routing, over the real tokens of every layer:
``f_e`` = share of the top-k assignments that go to expert e (summing to k), ``P_e`` = mean router probability
of expert e; loss = ``E * sum_e f_e * P_e`` (1.0 * k when perfectly balanced). The same quantity as transformers'
`load_balancing_loss_func` with a 2-D mask, computed from a per-token mask the trainer supplies, so it never
depends on the attention mask's layout (4-D block masks, prefix-shared rows).
"""

from __future__ import annotations

import torch
from torch import Tensor


def load_balancing_loss(router_logits: list[Tensor], top_k: int, token_mask: Tensor | None = None) -> Tensor:
    """router_logits: one (N, E) tensor per MoE layer, N = the flattened (B * T) tokens; token_mask: (N,) or
    (B, T), 1 for a real token (None: all). Returns the scalar loss (float32, differentiable in the logits)."""
    if not router_logits:
        raise ValueError("load_balancing_loss got no router logits: the model ran no mixture-of-experts layer.")
    n, num_experts = router_logits[0].shape
    mask = torch.ones(n, device=router_logits[0].device) if token_mask is None else token_mask.reshape(-1).float()
    if mask.numel() != n:
        raise ValueError(f"token_mask has {mask.numel()} entries for {n} routed tokens; give one per token.")
    counts = torch.zeros(num_experts, device=mask.device)
    probs = torch.zeros(num_experts, device=mask.device)
    for logits in router_logits:
        p = torch.softmax(logits.float(), dim=-1)
        chosen = torch.topk(p, top_k, dim=-1).indices  # (N, k)
        counts = counts.scatter_add(0, chosen.reshape(-1), mask.to(p.device).repeat_interleave(top_k))
        probs = probs + (p * mask.to(p.device).unsqueeze(-1)).sum(0)
    total = mask.sum().clamp(min=1) * len(router_logits)
    return num_experts * torch.sum((counts / total) * (probs / total))
