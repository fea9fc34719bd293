"""Steady decode's attention rows for a pass over the lanes: each lane's block table on the plane it
reads, the slot its K/V goes to and the position it attends from, in one operation (the Triton
kernel, lane_rows_triton.py, is one launch for the dozen small ones of the tensor form).

Per lane l: plane min(plane[l], max_plane); its table row where table_on[l], else the scratch block
everywhere; where slot_on[l] its slot at pos[l] and pos[l], else the scratch block's first slot and
position 0 (a lane whose output is not used: its attention reads one block, its K/V goes nowhere).
"""

import torch


def lane_rows(
    tables: torch.Tensor,
    plane: torch.Tensor,
    max_plane: int,
    pos: torch.Tensor,
    table_on: torch.Tensor,
    slot_on: torch.Tensor,
    scratch_block: int,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tables [L, P, W], plane, pos [L] int64, table_on, slot_on [L] bool -> (table [L, W], slot [L],
    positions [L])."""
    L, _, W = tables.shape
    bs = block_size
    table = tables[torch.arange(L, device=tables.device), plane.clamp(max=max_plane)]
    block = (pos // bs).clamp(max=W - 1).unsqueeze(1)
    slot = torch.where(
        slot_on, table.gather(1, block).squeeze(1) * bs + pos % bs, scratch_block * bs
    )
    return (
        torch.where(table_on.unsqueeze(1), table, scratch_block),
        slot,
        torch.where(slot_on, pos, 0),
    )
