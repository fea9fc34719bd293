"""RoPE in place on q and k together, one Triton launch (instead of ~10 torch ops per tensor):
rotate-half (Llama/Qwen2) or adjacent pairs (Huginn), angles computed in float32 from the
positions. The torch functions in rlt/models/layers.py are the reference."""

import torch
import triton
import triton.language as tl

from rlt.kernels import pdl


@triton.jit
def _rope_kernel(q_ptr, k_ptr, pos_ptr, inv_ptr, stride_qt, stride_qh, stride_kt, stride_kh, HQ: tl.constexpr,
                 HALF: tl.constexpr, HALF_PAD: tl.constexpr, PAIRS: tl.constexpr, PDL: tl.constexpr):
    pdl.begin(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)  # q heads first, then k heads
    j = tl.arange(0, HALF_PAD)
    ok = j < HALF
    angle = tl.load(pos_ptr + t).to(tl.float32) * tl.load(inv_ptr + j, mask=ok, other=0.0)
    c, s = tl.cos(angle), tl.sin(angle)
    if h < HQ:
        base = q_ptr + t * stride_qt + h * stride_qh
    else:
        base = k_ptr + t * stride_kt + (h - HQ) * stride_kh
    if PAIRS:  # (x[2j], x[2j+1]) as a complex number
        ia, ib = 2 * j, 2 * j + 1
    else:  # (x[j], x[j + D/2])
        ia, ib = j, j + HALF
    a = tl.load(base + ia, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(base + ib, mask=ok, other=0.0).to(tl.float32)
    tl.store(base + ia, (a * c - b * s).to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(base + ib, (b * c + a * s).to(q_ptr.dtype.element_ty), mask=ok)


def rope_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
          pairs: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D], k [T, Hkv, D] (last dim contiguous; views of the projection are fine), rotated in
    place and returned."""
    T, H, D = q.shape
    if T:
        half = D // 2
        pdl.launch(_rope_kernel, (T, H + k.shape[1]), q, k, positions, inv_freq, q.stride(0), q.stride(1),
                   k.stride(0), k.stride(1), HQ=H, HALF=half, HALF_PAD=triton.next_power_of_2(half), PAIRS=pairs,
                   like=q)
    return q, k
