"""CUDA graphs of the decode core: one pass of the shared loop over decode rows.

Decode steps are short and launch-bound (each layer is a dozen kernels), so the core pass over a
batch of single-row decode groups is captured once per (padded batch size, block-table width) and
replayed. Each row may be at a different depth: its plane is just its block table, which is graph
input. Padding rows write their K/V into the pool's scratch block and read nothing else.
"""

from dataclasses import dataclass

import numpy as np
import torch

from rlt.kernels.paged_attention import PagedMetadata
from rlt.workers.first_use import FirstUse

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    x: torch.Tensor
    inject: torch.Tensor
    ints: torch.Tensor  # [B * (2 + W)]: positions, slots, block tables; filled by one copy per replay
    kernel: dict  # the attention's fixed tile metadata: the graph reads it, so it must stay alive
    out: torch.Tensor
    gate: torch.Tensor | None


def table_width(w: int) -> int:
    """Block-table widths are padded to a power of two (one graph per width bucket)."""
    return 1 << max(0, (w - 1).bit_length())


def _bucket(n: int, w: int) -> tuple[int, int]:
    return next(b for b in BUCKETS if b >= n), table_width(w)


class DecodeGraphs:
    def __init__(self, model, pool, hidden: int, dtype: torch.dtype, device: str, max_batch: int, attention_cls):
        self.model, self.pool, self.hidden, self.dtype, self.device = model, pool, hidden, dtype, device
        self.max_batch = max_batch
        self.attention_cls = attention_cls
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        self.scratch_slot = pool.scratch_block * pool.block_size

    def fits(self, rows: int) -> bool:
        return rows <= min(self.max_batch, BUCKETS[-1])

    def inputs(self, pos: np.ndarray, tables: list[list[int]], starts: list[int], block_size: int) -> np.ndarray:
        """The graph's integer inputs for n single-row groups, padded on the host to the (batch,
        table width) bucket: padding rows sit at position 0, write to the scratch block, read only it."""
        n = len(tables)
        B, W = _bucket(n, max(len(t) for t in tables))
        out = np.empty(B * (2 + W), dtype=np.int64)
        out[:n], out[n:B] = pos, 0
        slots = out[B : 2 * B]
        slots[n:] = self.scratch_slot
        tab = out[2 * B :].reshape(B, W)
        tab.fill(self.pool.scratch_block)
        for i, (t, p) in enumerate(zip(tables, starts)):
            slots[i] = t[p // block_size] * block_size + p % block_size
            tab[i, : len(t)] = t
        return out

    def capture(self, B: int, W: int) -> None:
        """Capture the graph of this (batch, table width) bucket now, if it is not yet."""
        if (B, W) not in self.graphs:
            self.graphs[(B, W)] = self._capture(B, W)

    def _capture(self, B: int, W: int) -> _Graph:
        FirstUse.captures += 1
        FirstUse.log(f"CUDA graph of {B} rows, block tables {W} wide")
        dev, bs = self.device, self.pool.block_size
        ar = torch.arange(B, device=dev)
        ints = torch.zeros(B * (2 + W), dtype=torch.int64, device=dev)
        ints[B : 2 * B] = self.scratch_slot
        ints[2 * B :] = self.pool.scratch_block
        pos, slots, table = ints[:B], ints[B : 2 * B], ints[2 * B :].view(B, W)
        kernel = {
            "tile_seg": ar.clone(),
            "tile_row": torch.zeros_like(ar),
            "seg_row0": ar.clone(),
            "seg_rows": torch.ones_like(ar),
            "seg_q0": pos,
        }  # one row per segment: q0 is its position
        e = _Graph(
            torch.cuda.CUDAGraph(),
            torch.zeros(B, self.hidden, dtype=self.dtype, device=dev),
            torch.zeros(B, self.hidden, dtype=self.dtype, device=dev),
            ints,
            kernel,
            None,
            None,
        )
        meta = PagedMetadata(slots, table, list(range(B + 1)), [0] * B, bs, kernel)

        def forward():
            return self.model.loop(e.x, e.inject, pos, self.attention_cls(self.pool.cache, meta, None))

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # compile and allocate outside the capture; writes go to the scratch block
                forward()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(e.graph, pool=self.mempool):
            e.out, e.gate = forward()
        return e

    def run_device(self, x, inject, pos, slots, table):
        """The same pass with inputs already on the device (steady decode): x/inject [n, hidden],
        pos/slots [n], table [n, w]."""
        n, w = table.shape
        B, W = _bucket(n, w)
        self.capture(B, W)  # (captured at warm-up: stats() counts any capture after READY)
        e = self.graphs[(B, W)]
        e.x[:n].copy_(x)
        e.inject[:n].copy_(inject)
        e.ints[:n].copy_(pos)
        e.ints[B : B + n].copy_(slots)
        tab = e.ints[2 * B :].view(B, W)
        if n < B or w < W:  # padding rows and columns: position 0, scratch block
            e.ints[n:B].zero_()
            e.ints[B + n : 2 * B].fill_(self.scratch_slot)
            tab.fill_(self.pool.scratch_block)
        tab[:n, :w].copy_(table)
        e.graph.replay()
        return e.out[:n].clone(), None if e.gate is None else e.gate[:n]

    def run(self, states: list[torch.Tensor], injects: list[torch.Tensor], ints: torch.Tensor):
        """One core pass over n single-row decode groups -> (new states [n, hidden], gate logits [n] or
        None, valid until the next replay). ints: inputs() of the same rows, on the device."""
        n = len(states)
        B = next(b for b in BUCKETS if b >= n)
        W = ints.numel() // B - 2
        self.capture(B, W)
        e = self.graphs[(B, W)]
        torch.cat(states, out=e.x[:n])
        torch.cat(injects, out=e.inject[:n])
        e.ints.copy_(ints)
        e.graph.replay()
        # The gate is a view: the caller reads it in this step, before any other replay.
        return e.out[:n].clone(), None if e.gate is None else e.gate[:n]
