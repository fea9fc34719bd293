"""LAST_EXITED finalize copies in steady decode: a lane that exited at depth e copies its position's
K/V of plane e-1 into planes e..D-1, where deeper queries read it. The pairs are laid out for every
lane and plane (the device decides which to keep, the host never waits for it); most are not kept.

copy_slots is the torch reference (pairs not kept write the scratch slot); its Triton kernel
(kv_copy_triton.py) skips them and moves only the kept slots' bytes.
"""

import torch


def copy_slots(
    cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, keep: torch.Tensor, scratch_slot: int
) -> None:
    """cache [blocks, layers, 2, block_size, ...]: every layer's K and V of slot src[i] into slot dst[i]
    where keep[i] (src, dst: int64 slots [N], keep: bool [N])."""
    bs = cache.shape[3]
    d = torch.where(keep, dst, scratch_slot)
    cache[d // bs, :, :, d % bs] = cache[src // bs, :, :, src % bs]
