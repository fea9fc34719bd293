"""Triton kernel of rlt/kernels/kv_copy.py: one program per (pair, layer and K or V); a pair not
kept returns at once, so a launch over every lane and plane moves only what the exits need."""

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_slots_kernel(cache_ptr, src_ptr, dst_ptr, keep_ptr, BS, PARTS, HD, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    part = tl.program_id(1)  # layer * 2 + (0: K, 1: V)
    if tl.load(keep_ptr + i) != 0:
        s = tl.load(src_ptr + i).to(tl.int64)
        d = tl.load(dst_ptr + i).to(tl.int64)
        src = cache_ptr + (((s // BS) * PARTS + part) * BS + s % BS) * HD
        dst = cache_ptr + (((d // BS) * PARTS + part) * BS + d % BS) * HD
        for k0 in range(0, HD, BLOCK):
            k = k0 + tl.arange(0, BLOCK)
            tl.store(dst + k, tl.load(src + k, mask=k < HD), mask=k < HD)


def copy_slots(
    cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, keep: torch.Tensor, scratch_slot: int
) -> None:
    assert cache.is_contiguous()
    _, layers, two, bs = cache.shape[:4]
    hd = cache[0, 0, 0, 0].numel()
    if len(src):  # (the kernel reads element i at offset i: a broadcast src, stride 0, is made dense)
        src, dst, keep = src.contiguous(), dst.contiguous(), keep.to(torch.int8).contiguous()
        _copy_slots_kernel[(len(src), layers * two)](
            cache, src, dst, keep, bs, layers * two, hd, BLOCK=min(triton.next_power_of_2(hd), 4096)
        )
