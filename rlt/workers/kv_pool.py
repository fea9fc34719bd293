"""Depth-aware paged KV pool.

Physical blocks hold `block_size` positions of every layer of one storage plane:
cache[block, layer, k|v, offset, kv_head, head_dim], so one block of one plane is contiguous across
layers (a prompt's KV moves in a few large transfers). A request owns one block table per plane:
core planes (one per loop depth under LAST_EXITED, one shared plane under SHARED) and, for
families with boundary layers (Huginn's prelude and coda), one boundary plane.
"""

from dataclasses import dataclass

import torch

from rlt.config import ModelConfig

LAYOUTS = ("last_exited", "shared")


@dataclass
class BlockTables:
    core: list[list[int]]  # [plane][logical block] -> physical block
    boundary: list[int] | None


class KVPool:
    def __init__(self, mc: ModelConfig, layout: str, block_size: int, num_blocks: int, dtype, device):
        if layout not in LAYOUTS:
            raise ValueError(f"kv_layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        g = mc.kv
        self.layout, self.block_size, self.num_blocks = layout, block_size, num_blocks
        self.num_core_planes = mc.depth if layout == "last_exited" else 1
        self.has_boundary = g.num_boundary_layers > 0
        assert self.num_core_planes + int(self.has_boundary) == self.planes(mc, layout)
        layers = max(g.num_core_layers, g.num_boundary_layers)
        # One extra block that is never handed out: padding rows of a CUDA-graph batch write there.
        self.scratch_block = num_blocks
        self.cache = torch.zeros(
            num_blocks + 1, layers, 2, block_size, g.num_kv_heads, g.head_dim, dtype=dtype, device=device
        )
        self._free = list(range(num_blocks - 1, -1, -1))

    @staticmethod
    def planes(mc: ModelConfig, layout: str) -> int:
        """Block tables per request: core planes, and the boundary plane if the family has one."""
        return (mc.depth if layout == "last_exited" else 1) + int(mc.kv.num_boundary_layers > 0)

    # ---- capacity ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_needed(self, num_positions: int) -> int:
        per_plane = -(-num_positions // self.block_size)
        return per_plane * (self.num_core_planes + int(self.has_boundary))

    def allocate(self, num_positions: int) -> BlockTables:
        """Blocks for the first `num_positions` positions on every plane."""
        tables = BlockTables([[] for _ in range(self.num_core_planes)], [] if self.has_boundary else None)
        if not self.grow(tables, num_positions):
            raise MemoryError(f"need {self.blocks_needed(num_positions)} KV blocks, {len(self._free)} free")
        return tables

    def grow(self, tables: BlockTables, num_positions: int) -> bool:
        """Extend every plane's table to hold `num_positions` positions: all or nothing."""
        planes = tables.core + ([tables.boundary] if tables.boundary is not None else [])
        more = -(-num_positions // self.block_size) - len(planes[0])
        if more <= 0:
            return True
        if more * len(planes) > len(self._free):
            return False
        for t in planes:
            t.extend(self._free.pop() for _ in range(more))
        return True

    def capacity(self, tables: BlockTables) -> int:
        """Positions the tables hold."""
        return len(tables.core[0]) * self.block_size

    def free(self, tables: BlockTables) -> None:
        for t in tables.core + ([tables.boundary] if tables.boundary is not None else []):
            self._free.extend(reversed(t))
            t.clear()

    def plane_of(self, depth: int) -> int:
        """The core plane a loop at `depth` (1-based) reads and writes."""
        return depth - 1 if self.layout == "last_exited" else 0
