"""RoPE in place, one Triton launch per tensor (instead of ~10 torch ops): rotate-half (Llama/Qwen2)
or adjacent pairs (Huginn), angles computed in float32 from the positions. The torch functions in
rlt/models/layers.py are the reference."""

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(x_ptr, pos_ptr, inv_ptr, stride_t, stride_h, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                 PAIRS: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    j = tl.arange(0, HALF_PAD)
    ok = j < HALF
    angle = tl.load(pos_ptr + t).to(tl.float32) * tl.load(inv_ptr + j, mask=ok, other=0.0)
    c, s = tl.cos(angle), tl.sin(angle)
    base = x_ptr + t * stride_t + h * stride_h
    if PAIRS:  # (x[2j], x[2j+1]) as a complex number
        ia, ib = 2 * j, 2 * j + 1
    else:  # (x[j], x[j + D/2])
        ia, ib = j, j + HALF
    a = tl.load(base + ia, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(base + ib, mask=ok, other=0.0).to(tl.float32)
    tl.store(base + ia, (a * c - b * s).to(x_ptr.dtype.element_ty), mask=ok)
    tl.store(base + ib, (b * c + a * s).to(x_ptr.dtype.element_ty), mask=ok)


def rope_(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, pairs: bool) -> torch.Tensor:
    """x [T, H, D] (last dim contiguous; a view of the projection output is fine), rotated in place."""
    T, H, D = x.shape
    if T:
        half = D // 2
        _rope_kernel[(T, H)](x, positions, inv_freq, x.stride(0), x.stride(1), HALF=half,
                             HALF_PAD=triton.next_power_of_2(half), PAIRS=pairs)
    return x
