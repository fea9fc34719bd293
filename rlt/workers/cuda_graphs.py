"""CUDA graphs of the decode core: one pass of the shared loop over decode rows.

Decode steps are short and launch-bound (each layer is a dozen kernels), so the core pass over a
batch of single-row decode groups is captured once per (padded batch size, block-table width) and
replayed. Each row may be at a different depth: its plane is just its block table, which is graph
input. Padding rows write their K/V into the pool's scratch block and read nothing else.
"""

from dataclasses import dataclass

import torch

from rlt.kernels.paged_attention import PagedMetadata

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    x: torch.Tensor
    inject: torch.Tensor
    pos: torch.Tensor
    slots: torch.Tensor
    table: torch.Tensor
    kernel: dict
    out: torch.Tensor
    gate: torch.Tensor | None


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

    def _capture(self, B: int, W: int) -> _Graph:
        dev, bs = self.device, self.pool.block_size
        ar = torch.arange(B, device=dev)
        e = _Graph(torch.cuda.CUDAGraph(), torch.zeros(B, self.hidden, dtype=self.dtype, device=dev),
                   torch.zeros(B, self.hidden, dtype=self.dtype, device=dev), torch.zeros(B, dtype=torch.int64, device=dev),
                   torch.full((B,), self.scratch_slot, dtype=torch.int64, device=dev),
                   torch.full((B, W), self.pool.scratch_block, dtype=torch.int64, device=dev),
                   {"tile_seg": ar.clone(), "tile_row": torch.zeros_like(ar), "seg_row0": ar.clone(),
                    "seg_rows": torch.ones_like(ar), "seg_q0": torch.zeros_like(ar)}, None, None)
        meta = PagedMetadata(e.slots, e.table, list(range(B + 1)), [0] * B, bs, e.kernel)

        def forward():
            return self.model.loop(e.x, e.inject, e.pos, self.attention_cls(self.pool.cache, meta, None))

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # compile and allocate outside the capture; writes go to the scratch block
                forward()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(e.graph, pool=self.mempool):
            e.out, e.gate = forward()
        return e

    def run(self, x, inject, pos, slots, table):
        """One core pass over len(x) decode rows -> (new state, gate logits or None)."""
        n, w = x.shape[0], table.shape[1]
        B = next(b for b in BUCKETS if b >= n)
        W = 1 << max(0, (w - 1).bit_length())
        e = self.graphs.get((B, W))
        if e is None:
            e = self.graphs[(B, W)] = self._capture(B, W)
        e.x[:n].copy_(x)
        e.inject[:n].copy_(inject)
        e.pos[:n].copy_(pos)
        e.kernel["seg_q0"][:n].copy_(pos)
        e.slots[:n].copy_(slots)
        e.table[:n, :w].copy_(table)
        if n < B:  # rows a larger batch used last time are padding again
            e.pos[n:].zero_()
            e.kernel["seg_q0"][n:].zero_()
            e.slots[n:].fill_(self.scratch_slot)
            e.table[n:].fill_(self.pool.scratch_block)
        e.graph.replay()
        return e.out[:n].clone(), None if e.gate is None else e.gate[:n].clone()
