"""Depth-aware paged KV pool.

Physical blocks hold `block_size` positions of every layer of one storage plane:
cache[block, layer, k|v, offset, kv_head, head_dim], so one block of one plane is contiguous across
layers (a prompt's KV moves in a few large transfers). A request owns one block table per plane:
core planes (one per loop depth under LAST_EXITED, one shared plane under SHARED) and, for
families with boundary layers (Huginn's prelude and coda), one boundary plane. With the prefix
cache (rlt/workers/prefix_cache.py) a logical block of final positions, every plane together, may
be shared by several requests' tables and outlive them; its cached copies nobody holds count as free.
"""

from dataclasses import dataclass

import torch

from rlt.models.model_config import ModelConfig
from rlt.workers.prefix_cache import CachedBlock, PrefixCache

LAYOUTS = ("last_exited", "shared")


@dataclass
class BlockTables:
    core: list[list[int]]  # [plane][logical block] -> physical block
    boundary: list[int] | None

    @property
    def planes(self) -> list[list[int]]:
        """Every plane's table: the core planes, then the boundary plane if any."""
        return self.core + ([self.boundary] if self.boundary is not None else [])


class KVPool:
    def __init__(
        self,
        mc: ModelConfig,
        layout: str,
        block_size: int,
        num_blocks: int,
        dtype,
        device,
        caching: bool = False,
    ):
        if layout not in LAYOUTS:
            raise ValueError(f"kv_layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        g = mc.kv
        self.layout, self.block_size, self.num_blocks = layout, block_size, num_blocks
        self.num_core_planes = mc.depth if layout == "last_exited" else 1
        self.has_boundary = g.num_boundary_layers > 0
        assert self.num_planes == self.planes(mc, layout)
        layers = max(g.num_core_layers, g.num_boundary_layers)
        # One extra block that is never handed out: padding rows of a CUDA-graph batch write there.
        self.scratch_block = num_blocks
        # On a GPU the pool is zeroed (milliseconds), so no kernel's tile ever meets a NaN in a slot
        # not yet written. On the CPU it is not: zeroing its default 1 GiB took ~0.3 s of each
        # worker's start, while a slot is written before any pass reads it and the torch reference
        # reads no position past a segment's length (its pages are mapped at first write).
        alloc = torch.zeros if torch.device(device).type == "cuda" else torch.empty
        self.cache = alloc(
            num_blocks + 1,
            layers,
            2,
            block_size,
            g.num_kv_heads,
            g.head_dim,
            dtype=dtype,
            device=device,
        )
        self._free = list(range(num_blocks - 1, -1, -1))
        self.prefix = PrefixCache() if caching else None

    @staticmethod
    def planes(mc: ModelConfig, layout: str) -> int:
        """Block tables per request: core planes, and the boundary plane if the family has one."""
        return (mc.depth if layout == "last_exited" else 1) + int(mc.kv.num_boundary_layers > 0)

    # ---- capacity --------------------------------------------------------------------------------
    @property
    def num_planes(self) -> int:
        return self.num_core_planes + int(self.has_boundary)

    @property
    def num_free(self) -> int:
        """Blocks free or cached without references (evicted when taken)."""
        return len(self._free) + (
            self.prefix.num_unused * self.num_planes if self.prefix is not None else 0
        )

    @property
    def num_cached(self) -> int:
        """Blocks holding cached prefixes, in use or not."""
        return self.prefix.size * self.num_planes if self.prefix is not None else 0

    def blocks_needed(self, num_positions: int) -> int:
        return -(-num_positions // self.block_size) * self.num_planes

    def allocate(self, num_positions: int, shared: list[CachedBlock] = ()) -> BlockTables:
        """Tables for the first `num_positions` positions on every plane, starting with the cached
        blocks `shared` (a prefix hit)."""
        tables = BlockTables(
            [[] for _ in range(self.num_core_planes)], [] if self.has_boundary else None
        )
        if shared:  # (a long hit's hundreds of blocks: per plane at once)
            self.prefix.acquire(shared)
            for t, column in zip(tables.planes, zip(*(c.blocks for c in shared))):
                t.extend(column)
        if not self.grow(tables, num_positions):
            self.free(tables)
            raise MemoryError(
                f"need {self.blocks_needed(num_positions)} KV blocks, {self.num_free} free"
            )
        return tables

    def grow(self, tables: BlockTables, num_positions: int) -> bool:
        """Extend every plane's table to hold `num_positions` positions: all or nothing."""
        planes = tables.planes
        more = -(-num_positions // self.block_size) - len(planes[0])
        if more <= 0:
            return True
        if more * len(planes) > self.num_free:
            return False
        while len(self._free) < more * len(planes):
            self._free.extend(self.prefix.evict())
        for t in planes:  # (the last `more` free blocks, last first: as popping them one by one)
            t.extend(self._free[: -more - 1 : -1])
            del self._free[-more:]
        return True

    def capacity(self, tables: BlockTables) -> int:
        """Positions the tables hold."""
        return len(tables.core[0]) * self.block_size

    def cache_block(self, tables: BlockTables, index: int, key: bytes, gen: int = 0) -> None:
        """Keep logical block `index` (final on every plane) of request `gen` in the prefix cache
        under `key`."""
        if self.prefix is not None:
            self.prefix.insert(key, tuple(t[index] for t in tables.planes), (gen, index))

    def free(self, tables: BlockTables) -> None:
        """Every block back, last to first: cached ones stay cached (unused once nobody holds them)."""
        planes = tables.planes
        for i in range(len(planes[0]) - 1, -1, -1):
            if self.prefix is None or not self.prefix.release(planes[0][i]):
                self._free.extend(t[i] for t in planes)
        for t in planes:
            t.clear()

    def clear_cache(self) -> None:
        """Forget every cached block nobody holds, and the lookups counted."""
        if self.prefix is not None:
            self._free.extend(self.prefix.clear())

    def plane_of(self, depth: int) -> int:
        """The core plane a loop at `depth` (1-based) reads and writes."""
        return depth - 1 if self.layout == "last_exited" else 0
