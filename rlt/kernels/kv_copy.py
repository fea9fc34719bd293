"""LAST_EXITED finalize copies in steady decode: a lane done at depth e < D copies its position's
K/V of plane e-1 (its last loop's) into planes e..D-1, where deeper queries read it. The host never
waits for which lanes are done: the operation covers every lane and plane and keeps the pairs the
device marks.

finalize_copies is the torch reference (pairs not kept write the scratch slot); its Triton kernel
(kv_copy_triton.py) reads the tables itself and moves only the kept slots' bytes, in one launch.
"""

import torch


def finalize_copies(
    cache: torch.Tensor,
    tables: torch.Tensor,
    pos: torch.Tensor,
    depth: torch.Tensor,
    done: torch.Tensor,
    planes: int,
    scratch_slot: int,
) -> None:
    """cache [blocks, layers, 2, block_size, ...]; tables [L, >= planes, W] (the core planes first);
    pos, depth [L] int64 (each lane's position and loops run); done [L] bool."""
    bs, D = cache.shape[3], planes
    block = (pos // bs).clamp(max=tables.shape[2] - 1)
    slots = tables[:, :D].gather(2, block.view(-1, 1, 1).expand(-1, D, 1)).squeeze(2) * bs
    slots = slots + (pos % bs).unsqueeze(1)  # [L, D]: each core plane's slot of the position
    src = slots.gather(1, (depth - 1).clamp(min=0).unsqueeze(1)).expand(-1, D)
    keep = done.unsqueeze(1) & (torch.arange(D, device=depth.device) >= depth.unsqueeze(1))
    dst = torch.where(keep, slots, scratch_slot)
    cache[dst // bs, :, :, dst % bs] = cache[src // bs, :, :, src % bs]
