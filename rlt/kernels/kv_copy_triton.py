"""Triton kernel of rlt/kernels/kv_copy.py: one program per (lane and plane, layer and K or V); a
pair not kept returns at once, so one launch over every lane and plane moves only what exits need."""

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["W"])  # (table widths vary per stretch)
def _finalize_kernel(
    cache_ptr, tables_ptr, pos_ptr, depth_ptr, done_ptr, D, P, W, BS, PARTS, HD, BLOCK: tl.constexpr
):
    i = tl.program_id(0)
    lane, plane = i // D, i % D
    part = tl.program_id(1)  # layer * 2 + (0: K, 1: V)
    depth = tl.load(depth_ptr + lane)
    if (tl.load(done_ptr + lane) != 0) & (plane >= depth):
        pos = tl.load(pos_ptr + lane)
        row = tables_ptr + lane.to(tl.int64) * P * W + tl.minimum(pos // BS, W - 1)
        s = tl.load(row + tl.maximum(depth - 1, 0) * W) * BS + pos % BS
        d = tl.load(row + plane * W) * BS + pos % BS
        src = cache_ptr + ((s // BS * PARTS + part) * BS + s % BS) * HD
        dst = cache_ptr + ((d // BS * PARTS + part) * BS + d % BS) * HD
        for k0 in range(0, HD, BLOCK):
            k = k0 + tl.arange(0, BLOCK)
            tl.store(dst + k, tl.load(src + k, mask=k < HD), mask=k < HD)


def finalize_copies(cache, tables, pos, depth, done, planes: int, scratch_slot: int) -> None:
    _, layers, two, bs = cache.shape[:4]
    L, P, W = tables.shape
    for t in (cache, tables, pos, depth, done):
        assert t.is_contiguous()
    hd = cache[0, 0, 0, 0].numel()
    if L:
        _finalize_kernel[(L * planes, layers * two)](
            cache,
            tables,
            pos,
            depth,
            done.view(torch.int8),
            planes,
            P,
            W,
            bs,
            layers * two,
            hd,
            BLOCK=min(triton.next_power_of_2(hd), 4096),
        )
