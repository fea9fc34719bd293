"""Torch reference attention (CPU, tests, and the fallback behind every GPU kernel)."""

import torch
import torch.nn.functional as F


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int) -> torch.Tensor:
    """One sequence. q [T, H, D] holds positions q_start..q_start+T-1; k/v [S, Hkv, D] hold
    positions 0..S-1. Query t attends keys 0..q_start+t. Returns [T, H, D]."""
    T, H, D = q.shape
    S, Hkv = k.shape[0], k.shape[1]
    if Hkv != H:
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    mask = torch.arange(S, device=q.device).unsqueeze(0) <= (q_start + torch.arange(T, device=q.device)).unsqueeze(1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=mask, scale=D ** -0.5)
    return out.transpose(0, 1)
