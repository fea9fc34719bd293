"""Random paged-KV inputs shared by the kernel tests (GPU, and CPU under Triton's interpreter)."""

import random

import torch

from rlt.kernels.paged_attention import PagedMetadata

# first key, inside / at the edge of a 64-key tile, long
DECODE_POSITIONS = (0, 5, 63, 64, 100, 300)


def decode_case(
    H: int, Hkv: int, D: int, dtype: torch.dtype, device: str, layers: int = 2, bs: int = 16
):
    """One decode row per segment at DECODE_POSITIONS, blocks scattered over the pool ->
    (cache, reference metadata, block table, q, positions)."""
    rng = random.Random(0)
    g = torch.Generator(device=device).manual_seed(0)
    nb = sum(p // bs + 1 for p in DECODE_POSITIONS) + 8
    cache = torch.randn(nb, layers, 2, bs, Hkv, D, device=device, generator=g).to(dtype)
    blocks = rng.sample(range(nb), nb)
    tables = []
    for p in DECODE_POSITIONS:
        tables.append(blocks[: p // bs + 1])
        blocks = blocks[p // bs + 1 :]
    tab = torch.full((len(tables), max(map(len, tables))), nb - 1, dtype=torch.int64)
    for i, t in enumerate(tables):
        tab[i, : len(t)] = torch.tensor(t)
    tab = tab.to(device)
    pos = torch.tensor(DECODE_POSITIONS, device=device)
    q = torch.randn(len(tables), H, D, device=device, generator=g).to(dtype)
    slots = torch.tensor(
        [t[p // bs] * bs + p % bs for p, t in zip(DECODE_POSITIONS, tables)], device=device
    )
    meta = PagedMetadata(slots, tab, list(range(len(tables) + 1)), list(DECODE_POSITIONS), bs)
    return cache, meta, tab, q, pos
