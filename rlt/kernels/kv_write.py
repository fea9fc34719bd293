"""KV write in Triton: every row's K and V into its slot of the paged cache in one launch (the
torch reference, rlt/kernels/paged_attention.write_kv, takes ~6 kernels: slot arithmetic and two
scatters)."""

import torch
import triton
import triton.language as tl

from rlt.kernels import pdl


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, cache_ptr, slot_ptr, layer, stride_kt, stride_kh, stride_vt, stride_vh, stride_cb,
                     stride_cl, stride_ckv, stride_co, stride_ch, HKV: tl.constexpr, D: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.begin(PDL)
    t = tl.program_id(0)
    which = tl.program_id(1)  # 0: K, 1: V
    slot = tl.load(slot_ptr + t)
    dst = (cache_ptr + (slot // BLOCK_SIZE) * stride_cb + layer * stride_cl + which * stride_ckv
           + (slot % BLOCK_SIZE) * stride_co)
    e = tl.arange(0, BLOCK)
    ok = e < HKV * D
    h, d = e // D, e % D
    if which == 0:
        x = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=ok)
    else:
        x = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=ok)
    tl.store(dst + h * stride_ch + d, x, mask=ok)


def write_kv(cache: torch.Tensor, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             block_size: int) -> None:
    """cache [blocks, layers, 2, block_size, Hkv, D]; slots [T] flat slots; k/v [T, Hkv, D] (last dim
    contiguous; views of the projection are fine)."""
    T, Hkv, D = k.shape
    if T:
        pdl.launch(_write_kv_kernel, (T, 2), k, v, cache, slots, layer, k.stride(0), k.stride(1), v.stride(0),
                   v.stride(1), cache.stride(0), cache.stride(1), cache.stride(2), cache.stride(3), cache.stride(4),
                   HKV=Hkv, D=D, BLOCK_SIZE=block_size, BLOCK=triton.next_power_of_2(Hkv * D), like=k)
