"""Triton kernel of rlt/kernels/lane_rows.py: one program per lane."""

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["W", "MAX_PLANE"])  # (table widths vary per stretch)
def _lane_rows_kernel(
    tables_ptr,
    plane_ptr,
    pos_ptr,
    table_on_ptr,
    slot_on_ptr,
    table_ptr,
    slot_ptr,
    pos_out_ptr,
    P,
    W,
    MAX_PLANE,
    SCRATCH,
    BS,
    BLOCK: tl.constexpr,
):
    lane = tl.program_id(0).to(tl.int64)
    plane = tl.minimum(tl.load(plane_ptr + lane), MAX_PLANE)
    row = tables_ptr + (lane * P + plane) * W
    table_on = tl.load(table_on_ptr + lane) != 0
    slot_on = tl.load(slot_on_ptr + lane) != 0
    for k0 in range(0, W, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        t = tl.load(row + k, mask=k < W, other=0)
        tl.store(table_ptr + lane * W + k, tl.where(table_on, t, SCRATCH), mask=k < W)
    pos = tl.load(pos_ptr + lane)
    slot = tl.load(row + tl.minimum(pos // BS, W - 1)) * BS + pos % BS
    tl.store(slot_ptr + lane, tl.where(slot_on, slot, SCRATCH * BS))
    tl.store(pos_out_ptr + lane, tl.where(slot_on, pos, 0))


# table entries per step: one for every width (a width-derived tile would compile per width)
BLOCK = 256


def lane_rows(
    tables, plane, max_plane: int, pos, table_on, slot_on, scratch_block: int, block_size: int
):
    L, P, W = tables.shape
    for t in (tables, plane, pos, table_on, slot_on):
        assert t.is_contiguous()
    table = torch.empty(L, W, dtype=tables.dtype, device=tables.device)
    slot, positions = torch.empty_like(pos), torch.empty_like(pos)
    if L:
        _lane_rows_kernel[(L,)](
            tables,
            plane,
            pos,
            table_on.view(torch.int8),
            slot_on.view(torch.int8),
            table,
            slot,
            positions,
            P,
            W,
            max_plane,
            scratch_block,
            block_size,
            BLOCK=BLOCK,
        )
    return table, slot, positions
