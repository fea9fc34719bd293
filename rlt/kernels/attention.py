"""Torch reference attention: what the CPU and EngineConfig.kernels == "reference" run, and what the
GPU attention kernels are tested against."""

import torch
import torch.nn.functional as F


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int
) -> torch.Tensor:
    """One sequence. q [T, H, D] holds positions q_start..q_start+T-1; k/v [S, Hkv, D] hold
    positions 0..S-1. Query t attends keys 0..q_start+t. Returns [T, H, D]."""
    T, H, D = q.shape
    S, Hkv = k.shape[0], k.shape[1]
    q4, k4, v4 = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # 4-D: SDPA's fused kernels
    if T == 1 and q_start == S - 1:  # one query, the last position: it sees every key, no mask
        out = F.scaled_dot_product_attention(q4, k4, v4, scale=D**-0.5, enable_gqa=Hkv != H)
        return out.squeeze(0).transpose(0, 1)
    if q.device.type == "cpu" and 0 < q_start == S - T:
        return _prefix_then_causal_cpu(q4, k4, v4, q_start, D**-0.5).squeeze(0).transpose(0, 1)
    mask = torch.arange(S, device=q.device).unsqueeze(0) <= (
        q_start + torch.arange(T, device=q.device)
    ).unsqueeze(1)
    out = F.scaled_dot_product_attention(
        q4, k4, v4, attn_mask=mask, scale=D**-0.5, enable_gqa=Hkv != H
    )
    return out.squeeze(0).transpose(0, 1)


def _prefix_then_causal_cpu(q, k, v, prefix: int, scale: float) -> torch.Tensor:
    """A prompt chunk after a prefix, on the CPU: every query sees all prefix keys (no mask) and its
    own chunk's keys causally. The two halves run through the CPU flash kernel, which returns each
    row's log-sum-exp, and are merged exactly; a masked SDPA over the whole range is twice as slow.
    q [1, H, T, D], k/v [1, Hkv, S, D]."""
    if k.shape[1] != q.shape[1]:
        k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    o1, lse1 = flash(q, k[:, :, :prefix], v[:, :, :prefix], 0.0, False, scale=scale)
    o2, lse2 = flash(q, k[:, :, prefix:], v[:, :, prefix:], 0.0, True, scale=scale)
    w1 = torch.sigmoid(lse1 - lse2).unsqueeze(-1)  # = e^lse1 / (e^lse1 + e^lse2)
    return o2 + (o1 - o2) * w1


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
