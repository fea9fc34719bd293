"""CUDA graphs of the core: one pass of the shared loop, captured once per shape and replayed.

A pass is launch-bound unless it carries thousands of rows (each layer is a dozen kernels, and a
loop step runs every layer), so both kinds of pass replay graphs:
- DecodeGraphs: single-row decode groups, per (padded batch size, block-table width), attention
  by the decode kernel;
- PassGraphs: any mix of prompt chunks and decode rows, per (padded row count, block-table width),
  attention by the general paged kernel, whose work queue takes the pass's own tiles from
  metadata sized for the bucket's most (rlt/kernels/paged_attention_triton.py).
Each row may be at a different depth: its plane is just its block table, which is graph input.
Padding rows write their K/V into the pool's scratch block and read nothing else.
"""

import gc
from dataclasses import dataclass, replace

import numpy as np
import torch

from rlt.kernels.paged_attention import KernelPlan, PagedMetadata, kernel_fields, split_count
from rlt.workers.pass_rows import row_slots

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# rows of a pass carrying prompt chunks
PASS_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 1536, 2048)
MAX_SEGMENTS = 256  # groups a graphed pass can carry (a pass with more runs eagerly)
# A pass graph's integer inputs, in order: rows, segments, the tile lists
# (paged_attention.kernel_fields), tables
_TILE_LISTS = (("tile_seg", "tile_row", "work"), ("packed_seg", "packed_row", "packed_work"))
_PASS_INPUTS = (
    "pos",
    "slots",
    "seg_row0",
    "seg_rows",
    "seg_q0",
    *_TILE_LISTS[0],
    *_TILE_LISTS[1],
    "table",
)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    x: torch.Tensor
    inject: torch.Tensor
    # [B * (2 + W)]: positions, slots, block tables; filled by one copy per replay
    ints: torch.Tensor
    kernel: dict  # the attention's fixed tile metadata: the graph reads it, so it must stay alive
    out: torch.Tensor
    gate: torch.Tensor | None


def table_width(w: int) -> int:
    """Block-table widths are padded to a power of two (one graph per width bucket)."""
    return 1 << max(0, (w - 1).bit_length())


def _rows(n: int) -> int:
    """The batch bucket of n single-row groups."""
    return next(b for b in BUCKETS if b >= n)


def _bucket(n: int, w: int) -> tuple[int, int]:
    return _rows(n), table_width(w)


class DecodeGraphs:
    """attention: the backend's (core metadata -> the models' Attention); plan: its attention's
    plan for a decode-only pass (rlt/workers/backend.py)."""

    def __init__(self, model, pool, hidden, dtype, device, counters, max_batch, attention, plan):
        self.model, self.pool, self.hidden = model, pool, hidden
        self.dtype, self.device = dtype, device
        self.counters = counters  # (WorkerCounters: each capture counted)
        self.max_batch = max_batch
        self.attention, self.plan = attention, plan
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        self.scratch_slot = pool.scratch_block * pool.block_size

    def fits(self, rows: int) -> bool:
        return rows <= min(self.max_batch, BUCKETS[-1])

    def inputs(
        self, pos: np.ndarray, tables: list[list[int]], starts: list[int], block_size: int
    ) -> np.ndarray:
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

    @staticmethod
    def slots(ints: torch.Tensor, n: int) -> torch.Tensor:
        """The K/V slots of the n rows in inputs() on the device (a view)."""
        B = _rows(n)
        return ints[B : B + n]

    def capture(self, B: int, W: int) -> None:
        """Capture the graph of this (batch, table width) bucket now, if it is not yet."""
        if (B, W) not in self.graphs:
            self.graphs[(B, W)] = self._capture(B, W)

    def _capture(self, B: int, W: int) -> _Graph:
        self.counters.captured(f"{B} rows, block tables {W} wide")
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
            "work": torch.tensor([1, B], device=dev),
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
        meta = PagedMetadata(slots, table, list(range(B + 1)), [0] * B, bs, kernel, self.plan)
        _record(e, self.mempool, lambda: self.model.loop(e.x, e.inject, pos, self.attention(meta)))
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
        B = _rows(n)
        W = ints.numel() // B - 2
        self.capture(B, W)
        return replay(self.graphs[(B, W)], states, injects, ints)


def replay(e: _Graph, states: list[torch.Tensor], injects: list[torch.Tensor], ints: torch.Tensor):
    """A pass's rows into graph e (its first rows), its integer inputs whole, the replay -> (new
    states [n, hidden], gate logits [n] or None). The gate is a view: the caller reads it in this
    step, before any other replay."""
    n = sum(len(x) for x in states)
    torch.cat(states, out=e.x[:n])
    torch.cat(injects, out=e.inject[:n])
    e.ints.copy_(ints)
    e.graph.replay()
    return e.out[:n].clone(), None if e.gate is None else e.gate[:n]


def _record(e: _Graph, mempool, forward) -> None:
    """Run forward twice on a side stream (compile, allocate; writes go to the scratch block), then
    capture it into e.graph, its outputs into e.out / e.gate."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    # No garbage collection while capturing: a CUDA graph the collector frees then (an engine left
    # in
    # a reference cycle) destroys its executable mid-capture, which CUDA forbids and which
    # invalidates this capture. The garbage waits for the next collection.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(e.graph, pool=mempool):
            e.out, e.gate = forward()
    finally:
        if collecting:
            gc.enable()


class PassGraphs:
    """Graphs of passes carrying prompt chunks (with or without decode rows), up to max_rows rows.
    Integer inputs, in one buffer: positions and slots [R], then per segment (S of them and one
    empty segment that padding tiles point at) first row, rows and first position, then per tile
    (T = R / tile_rows + S) its segment and first row and the launch's work, the same of the packed
    tiles (none without GQA packing), then the block tables [S + 1, W].
    attention: the backend's (core metadata -> the models' Attention); plan: its tiling (no dense
    segments, not the decode kernel)."""

    def __init__(self, model, pool, hidden, dtype, device, counters, max_rows, attention, plan):
        self.model, self.pool, self.hidden = model, pool, hidden
        self.dtype, self.device = dtype, device
        self.counters = counters  # (WorkerCounters: each capture counted)
        self.attention, self.plan = attention, plan
        self.buckets = [b for b in PASS_BUCKETS if b < max_rows] + [
            b for b in PASS_BUCKETS if b >= max_rows
        ][:1]
        self.tile_rows = plan.tile_rows
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        self.scratch_slot = pool.scratch_block * pool.block_size

    def _shape(self, R: int) -> tuple[int, int, int]:
        """(segments, tiles, packed tiles) of a pass of R rows, at most."""
        S, plan = min(R, MAX_SEGMENTS), self.plan
        return S, R // self.tile_rows + S, R // plan.packed_rows + S if plan.pack > 1 else 0

    def _plan(self, R: int) -> KernelPlan:
        """The tiling of bucket R's graph, with the most key slices a pass of its rows can take (it
        holds more rows than the bucket below: at least that many tiles, or a packed one)."""
        below = max([b for b in self.buckets if b < R], default=0)
        fewest, plan = -(-(below + 1) // self.tile_rows), self.plan
        packed_splits = split_count(1, plan.packed_fill) if plan.pack > 1 else 1
        return replace(
            plan, max_splits=split_count(fewest, plan.fill_tiles), packed_splits=packed_splits
        )

    def fits(self, rows: int, segments: int) -> bool:
        return bool(self.buckets) and rows <= self.buckets[-1] and segments <= MAX_SEGMENTS

    def _layout(self, R: int, W: int) -> dict[str, slice]:
        """Where each field lies in the integer inputs."""
        S, T, TP = self._shape(R)
        sizes = [R, R, S + 1, S + 1, S + 1, T, T, 2, TP, TP, 2, (S + 1) * W]
        ends = np.cumsum(sizes).tolist()
        return {name: slice(end - size, end) for name, size, end in zip(_PASS_INPUTS, sizes, ends)}

    def inputs(
        self, pos, tables: list[list[int]], row_starts: list[int], q_starts
    ) -> tuple[tuple, np.ndarray]:
        """-> the pass's (rows, width) bucket and its integer inputs, padded on the host to it. pos:
        every row's position; tables: each group's block table; its rows start at q_starts."""
        n, segs = row_starts[-1], len(tables)
        R = next(b for b in self.buckets if b >= n)
        W = table_width(max(len(t) for t in tables))
        S = self._shape(R)[0]
        at = self._layout(R, W)
        out = np.zeros(at["table"].stop, dtype=np.int64)
        field = lambda name: out[at[name]]  # noqa: E731 - a view
        field("pos")[:n] = pos
        field("slots")[n:] = self.scratch_slot
        k = kernel_fields(row_starts, q_starts, self._plan(R))
        for name in ("seg_row0", "seg_rows", "seg_q0"):
            field(name)[:segs] = k[name]  # the rest, the empty segment S among them, stay 0
        for seg, row, work in _TILE_LISTS[: 2 if self.plan.pack > 1 else 1]:
            tiles = len(k[seg])
            field(seg)[:tiles] = k[seg]
            field(seg)[tiles:] = S  # padding tiles: the empty segment
            field(row)[:tiles] = k[row]
            field(work)[:] = k[work]
        tab = field("table").reshape(S + 1, W)
        tab.fill(self.pool.scratch_block)
        for i, t in enumerate(tables):
            tab[i, : len(t)] = t
        field("slots")[:n] = row_slots(tab[:segs], row_starts, pos, self.pool.block_size)
        return (R, W), out

    def slots(self, key: tuple[int, int], ints: torch.Tensor, n: int) -> torch.Tensor:
        """The K/V slots of the pass's n rows in inputs() on the device (a view)."""
        return ints[self._layout(*key)["slots"]][:n]

    def capture(self, R: int, W: int) -> None:
        if (R, W) not in self.graphs:
            self.graphs[(R, W)] = self._capture(R, W)

    def _capture(self, R: int, W: int) -> _Graph:
        self.counters.captured(f"a {R}-row pass, block tables {W} wide")
        S = self._shape(R)[0]
        at = self._layout(R, W)
        ints = torch.zeros(at["table"].stop, dtype=torch.int64, device=self.device)
        ints[at["slots"]] = self.scratch_slot
        for seg, _, work in _TILE_LISTS:
            ints[at[seg]] = S
            ints[at[work].start] = 1  # (no tiles at capture: each replay reads its pass's work)
        ints[at["table"]] = self.pool.scratch_block
        pos, slots = ints[at["pos"]], ints[at["slots"]]
        kernel = {name: ints[at[name]] for name in _PASS_INPUTS[2:-1]}
        table = ints[at["table"]].view(S + 1, W)
        z = lambda: torch.zeros(R, self.hidden, dtype=self.dtype, device=self.device)  # noqa: E731
        e = _Graph(torch.cuda.CUDAGraph(), z(), z(), ints, kernel, None, None)
        # (the host fields are unused: the plan picks the kernel and its tiling)
        meta = PagedMetadata(slots, table, [0, R], [0], self.pool.block_size, kernel, self._plan(R))
        _record(e, self.mempool, lambda: self.model.loop(e.x, e.inject, pos, self.attention(meta)))
        return e

    def run(
        self,
        key: tuple[int, int],
        states: list[torch.Tensor],
        injects: list[torch.Tensor],
        ints: torch.Tensor,
    ):
        """One core pass over these groups' rows -> (new states [n, hidden], gate logits [n] or None,
        valid until the next replay). key, ints: inputs() of the same pass (ints on the device)."""
        self.capture(*key)  # (captured at warm-up: stats() counts any capture after READY)
        return replay(self.graphs[key], states, injects, ints)
