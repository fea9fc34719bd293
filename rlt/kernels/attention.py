"""Torch reference attention: what the CPU and EngineConfig.kernels == "reference" run, and what the
GPU attention kernels are tested against."""

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
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=D**-0.5
    )
    return out.transpose(0, 1)


def prefix_free_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A prompt chunk at positions 0..T-1 over its own keys: plain causal SDPA (flash kernels on
    CUDA; grouped heads without repeating K/V). q [T, H, D], k/v [T, Hkv, D] -> [T, H, D]."""
    H, Hkv, D = q.shape[1], k.shape[1], q.shape[2]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        is_causal=True,
        scale=D**-0.5,
        enable_gqa=Hkv != H,
    )
    return out.squeeze(0).transpose(0, 1)
