"""CUDA graphs of a pass holding one prompt chunk at position 0 and nothing else (a lone prompt's
first chunk, at every loop): its keys are its own rows, so its attention is dense causal flash
SDPA over them, as an eager pass runs such a chunk, where PassGraphs would run the paged kernel
(about twice SDPA's time on a prompt) and an eager pass of many rows waits on the host (a dozen
launches per layer). Rows are padded to a bucket: padding rows come after the prompt's, so no
prompt row attends to them, and they write their K/V into the scratch block. One graph per bucket
(dense attention reads no block table)."""

import numpy as np
import torch

from rlt.kernels.paged_attention import DENSE_MIN_ROWS, KernelPlan, PagedMetadata
from rlt.workers.cuda_graphs import _Graph, _record, replay

PROMPT_BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DENSE = KernelPlan(dense=(0,))  # one segment, on dense SDPA (rlt/kernels/paged_attention.py)


class PromptGraphs:
    def __init__(self, model, pool, hidden, dtype, device, counters, max_rows, attention, mempool):
        """max_rows: the longest prompt chunk a pass carries (prefill_chunk, at most
        max_num_batched_tokens); mempool: shared with the other graphs of passes carrying prompt
        chunks (one pass replays at a time)."""
        self.model, self.pool, self.hidden = model, pool, hidden
        self.dtype, self.device = dtype, device
        self.counters = counters  # (WorkerCounters: each capture counted)
        self.attention, self.mempool = attention, mempool
        self.buckets = [b for b in PROMPT_BUCKETS if b < max_rows] + [
            b for b in PROMPT_BUCKETS if b >= max_rows
        ][:1]
        self.graphs: dict[int, _Graph] = {}
        self.scratch_slot = pool.scratch_block * pool.block_size

    def fits(self, groups: list, rows: int) -> bool:
        """A pass of one prompt chunk at position 0, long enough for dense attention."""
        return (
            len(groups) == 1 and groups[0].start == 0 and DENSE_MIN_ROWS <= rows <= self.buckets[-1]
        )

    def inputs(self, pos: np.ndarray, table: list[int]) -> tuple[int, np.ndarray]:
        """-> the bucket and its integer inputs, padded on the host: positions, then K/V slots."""
        n, bs = len(pos), self.pool.block_size
        R = next(b for b in self.buckets if b >= n)
        out = np.zeros(2 * R, dtype=np.int64)
        out[:n] = pos
        out[R : R + n] = np.asarray(table, dtype=np.int64)[pos // bs] * bs + pos % bs
        out[R + n :] = self.scratch_slot
        return R, out

    @staticmethod
    def slots(R: int, ints: torch.Tensor, n: int) -> torch.Tensor:
        return ints[R : R + n]

    def capture(self, R: int, W: int = 0) -> None:
        """(W: unused, warm-up's shapes carry a table width)"""
        if R not in self.graphs:
            self.graphs[R] = self._capture(R)

    def _capture(self, R: int) -> _Graph:
        self.counters.captured(f"a lone {R}-row prompt chunk")
        ints = torch.zeros(2 * R, dtype=torch.int64, device=self.device)
        ints[R:] = self.scratch_slot
        pos, slots = ints[:R], ints[R:]
        z = lambda: torch.zeros(R, self.hidden, dtype=self.dtype, device=self.device)  # noqa: E731
        e = _Graph(torch.cuda.CUDAGraph(), z(), z(), ints, {}, None, None)
        meta = PagedMetadata(slots, None, [0, R], [0], self.pool.block_size, None, DENSE)
        _record(e, self.mempool, lambda: self.model.loop(e.x, e.inject, pos, self.attention(meta)))
        return e

    def run(
        self, R: int, states: list[torch.Tensor], injects: list[torch.Tensor], ints: torch.Tensor
    ):
        """The pass -> (new states [n, hidden], gate logits [n] or None, valid until the next replay)."""
        self.capture(R)  # (captured at warm-up: stats() counts any capture after READY)
        return replay(self.graphs[R], states, injects, ints)
