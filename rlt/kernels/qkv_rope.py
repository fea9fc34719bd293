"""The one-row q/k/v product with RoPE and the K/V store as its epilogue: a decode pass of one row
(concurrency 1) runs its attention's projection, rotation and store in one launch instead of the
GEMV (rlt/kernels/gemv.py) and the RoPE launch after it (rlt/kernels/rope.py): a one-row layer is a
latency chain, and each kernel boundary in it costs about a microsecond and a half.

A program computes one rotation pair, rows j and j + D/2 of one head of the fused [q; k; v] weight
(rotate-half; Huginn's adjacent pairs and q/k bias keep the two launches), so each rotation is in
one program's registers. Its first weight tile, its angle and the slot are read before the PDL
wait (weights, inv_freq, positions and slots are never written during a pass); the input row only
after it. Rounding follows the two launches: the product rounded to the row's dtype, then rotated
in float32 and rounded again; the result is the same bit for bit.
"""

import torch
import triton
import triton.language as tl

from rlt.kernels import gemv, pdl
from rlt.kernels.rope import slot_offset

BLOCK_K, WARPS = gemv.CONFIG.k, gemv.CONFIG.warps  # as the one-row GEMV's


# One variant for every layer index (see _paged_attn_kernel).
@triton.jit(do_not_specialize=["layer"])
def _qkv_rope_kernel(
    x_ptr,
    w_ptr,
    q_ptr,
    cache_ptr,
    pos_ptr,
    inv_ptr,
    slot_ptr,
    layer,
    K,
    stride_wn,
    stride_qh,
    stride_cb,
    stride_cl,
    stride_ckv,
    stride_co,
    stride_ch,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program p: head h = p // HALF (q heads, then k, then v), pair j = p % HALF: q rotated into
    q_ptr [H, D]; k rotated and v as it is stored into the cache at the slot."""
    p = tl.program_id(0)
    h = p // HALF
    j = p % HALF
    idx = tl.arange(0, 2)  # (row j, row j + HALF)
    rows = w_ptr + (h * 2 * HALF + j + idx * HALF)[:, None].to(tl.int64) * stride_wn
    offs_k = tl.arange(0, BLOCK_K)
    w = tl.load(rows + offs_k[None, :], mask=(offs_k < K)[None, :], other=0.0)
    angle = tl.load(pos_ptr).to(tl.float32) * tl.load(inv_ptr + j)
    c, s = tl.cos(angle), tl.sin(angle)
    slot = tl.load(slot_ptr)
    pdl.begin(PDL)
    acc = tl.zeros((2, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        if k0 > 0:
            w = tl.load(rows + kk[None, :], mask=(kk < K)[None, :], other=0.0)
        x = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
    dt = q_ptr.dtype.element_ty
    y = tl.sum(acc, axis=1).to(dt).to(tl.float32)  # (a, b) as the GEMV rounds them
    a = tl.sum(tl.where(idx == 0, y, 0.0), axis=0)
    b = tl.sum(tl.where(idx == 1, y, 0.0), axis=0)
    is_v = h >= HQ + HKV
    ra = tl.where(is_v, a, a * c - b * s)
    rb = tl.where(is_v, b, b * c + a * s)
    out = tl.where(idx == 0, ra, rb).to(dt)
    if h < HQ:
        tl.store(q_ptr + h * stride_qh + j + idx * HALF, out)
    else:
        which = is_v.to(tl.int32)  # 0: K, 1: V
        kv_head = h - HQ - which * HKV
        at = (
            slot_offset(slot, layer, stride_cb, stride_cl, stride_co, BLOCK_SIZE)
            + which * stride_ckv
        )
        tl.store(cache_ptr + at + kv_head * stride_ch + j + idx * HALF, out)


def qkv_rope_write_kv(
    x: torch.Tensor,
    w: torch.Tensor,
    heads: tuple[int, int, int],
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    cache: torch.Tensor,
    layer: int,
    slots: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """x [1, K] (contiguous), w the fused [q; k; v] weight [(H + 2 Hkv) D, K], heads (H, Hkv, D):
    -> q [1, H, D] rotated (rotate-half) at positions[0]; k rotated and v stored at slots[0] of cache
    [blocks, layers, 2, block_size, Hkv, D] at this layer. Equals gemv, split_qkv, rope_write_kv."""
    H, Hkv, D = heads
    assert x.shape[0] == 1 and w.shape[0] == (H + 2 * Hkv) * D and D % 2 == 0
    q = torch.empty(1, H, D, dtype=x.dtype, device=x.device)
    pdl.launch(
        _qkv_rope_kernel,
        ((H + 2 * Hkv) * D // 2,),
        x.contiguous(),
        w,
        q,
        cache,
        positions,
        inv_freq,
        slots,
        layer,
        w.shape[1],
        w.stride(0),
        q.stride(1),
        *cache.stride()[:5],
        HQ=H,
        HKV=Hkv,
        HALF=D // 2,
        BLOCK_SIZE=block_size,
        BLOCK_K=BLOCK_K,
        num_warps=WARPS,
        like=x,
    )
    return q
