"""A worker's kernel backend, chosen once from its config (select_backend) and built over its model
and KV pool. It holds the layer operations the model runs (handed to the model as model.ops), the
penalty kernels, and attention over the paged pool; it builds a pass's attention metadata
(PagedMetadata, packed with the step) and decides how a core pass runs: eagerly, or replayed from a
CUDA graph it captured.

- ReferenceBackend: the torch reference, eager passes (the CPU always; CUDA with kernels="reference");
- TritonBackend: the Triton kernels, CUDA graphs of decode passes and of passes carrying prompt chunks;
- BatchInvariantBackend: the same, with every pass on one attention tiling and the general attention
  kernel, and products off the one-row GEMV: a row's result never depends on what shares its pass.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from rlt.contract.config import EngineConfig
from rlt.kernels import kv_copy, lane_checks, lane_rows
from rlt.kernels.paged_attention import (
    KERNEL_BLOCK_M,
    PREFILL_BLOCK_M,
    KernelPlan,
    PagedMetadata,
    kernel_fields,
    kernel_paged_attention,
    paged_attention,
    plan_kernel,
    write_kv,
)
from rlt.kernels.penalties import REFERENCE as REFERENCE_SLOTS
from rlt.kernels.penalties import triton_slot_kernels
from rlt.models.layers import rope, split_qkv
from rlt.models.model_config import ModelConfig
from rlt.models.ops import REFERENCE, BatchInvariantOps, TritonOps, gemv_fits
from rlt.workers.counters import WorkerCounters
from rlt.workers.cuda_graphs import BUCKETS, DecodeGraphs, PassGraphs
from rlt.workers.pass_rows import padded, positions, row_slots
from rlt.workers.prompt_graphs import PromptGraphs


class PassAttention:
    """The models' Attention interface (rlt/models/base.py) over the paged pool, for one pass:
    core and boundary layers read their own metadata; attend and attend_qkv are the backend's."""

    __slots__ = ("attend", "attend_qkv", "cache", "core_meta", "boundary_meta")

    def __init__(
        self, attend, attend_qkv, cache, core: PagedMetadata | None, boundary: PagedMetadata | None
    ):
        self.attend, self.attend_qkv, self.cache = attend, attend_qkv, cache
        self.core_meta, self.boundary_meta = core, boundary

    def core(self, layer, q, k, v, rotary):
        return self.attend(self.cache, layer, self.core_meta, q, k, v, rotary)

    def core_qkv(self, layer, linear, h, w, heads, rotary):
        return self.attend_qkv(self.cache, layer, self.core_meta, linear, h, w, heads, rotary)

    def boundary(self, layer, q, k, v, rotary):
        return self.attend(self.cache, layer, self.boundary_meta, q, k, v, rotary)


@dataclass
class CorePass:
    """One pass of the core as the backend runs it. inputs: what it needs from the host, packed with
    the step's metadata (an array, or PagedMetadata); slots(packed inputs): its rows' K/V slots on
    the device; run(states, injects, positions, packed inputs) -> (new states, gate logits or None)."""

    inputs: np.ndarray | PagedMetadata
    slots: Callable
    run: Callable


def reference_attend(counters: WorkerCounters):
    """The reference attention of a layer (its K/V stored first), counting into `counters`."""

    def attend(cache, layer, meta: PagedMetadata, q, k, v, rotary):
        counters.progress += 1  # a layer of the pass: a long step is not a stuck one
        q, k = rope(q, k, *rotary)
        write_kv(cache, layer, meta, k, v)
        return paged_attention(cache, layer, meta, q, k, v)

    def attend_qkv(cache, layer, meta: PagedMetadata, linear, h, w, heads, rotary):
        return attend(cache, layer, meta, *split_qkv(linear(h, w), *heads), rotary)

    return attend, attend_qkv


class ReferenceBackend:
    """The torch reference: eager passes, attention by rlt/kernels/paged_attention.paged_attention."""

    needs_warm_up = False  # no Triton specialization or CUDA graph to build before READY
    ops = REFERENCE
    slot_kernels = REFERENCE_SLOTS

    finalize_copies = staticmethod(kv_copy.finalize_copies)
    _lane_rows = staticmethod(lane_rows.lane_rows)
    latent_checks = staticmethod(lane_checks.latent_checks)  # (steady decode's checks, Huginn)

    def __init__(self, mc: ModelConfig, model, pool, cfg: EngineConfig, counters: WorkerCounters):
        self.model, self.pool, self.counters = model, pool, counters
        self.attend, self.attend_qkv = reference_attend(counters)

    def finalize(
        self, tables: torch.Tensor, pos: torch.Tensor, depth: torch.Tensor, done: torch.Tensor
    ) -> None:
        """Steady decode's LAST_EXITED finalize copies (rlt/kernels/kv_copy.py) for lanes done now."""
        pool = self.pool
        self.finalize_copies(
            pool.cache,
            tables,
            pos,
            depth,
            done,
            pool.num_core_planes,
            pool.scratch_block * pool.block_size,
        )

    def lane_rows(self, tables, plane, max_plane: int, pos, table_on, slot_on):
        """Steady decode's (table, slot, position) per lane for a pass (rlt/kernels/lane_rows.py)."""
        pool = self.pool
        return self._lane_rows(
            tables, plane, max_plane, pos, table_on, slot_on, pool.scratch_block, pool.block_size
        )

    def plane(self, groups: list, row_starts: list[int], tables: list[list[int]]) -> PagedMetadata:
        """The metadata of one plane per group: slots each row's K/V goes to, the block table each
        group reads (host arrays: StepBuffers.pack sends them)."""
        bs, table = self.pool.block_size, padded(tables)
        slots = row_slots(table, row_starts, positions(groups, row_starts), bs)
        return PagedMetadata(slots, table, row_starts, [g.start for g in groups], bs)

    def attention(
        self, core: PagedMetadata | None = None, boundary: PagedMetadata | None = None
    ) -> PassAttention:
        return PassAttention(self.attend, self.attend_qkv, self.pool.cache, core, boundary)

    def core_pass(
        self, active: list, row_starts: list[int], pos: np.ndarray, tables: list[list[int]]
    ) -> CorePass:
        """How the core pass over these groups (pos: every row's position, tables: each group's block
        table of the plane it reads) runs."""
        return CorePass(self.plane(active, row_starts, tables), _slot_mapping, self._eager)

    def _eager(self, states, injects, positions, meta: PagedMetadata):
        return self.model.loop(
            torch.cat(states), torch.cat(injects), positions, self.attention(meta)
        )

    def lane_meta(self, pos, slot, table) -> PagedMetadata:
        """Steady decode's metadata (rlt/workers/steady.py): one row per lane at positions pos [n],
        its K/V to slot [n], reading table [n, w]; all on the device."""
        n = len(pos)  # (the reference attention loops over segments on the host)
        return PagedMetadata(slot, table, list(range(n + 1)), pos.tolist(), self.pool.block_size)

    def lane_pass(self, x, inject, pos, slot, table):
        """A steady-decode pass: the core over every lane."""
        return self.model.loop(x, inject, pos, self.attention(self.lane_meta(pos, slot, table)))

    def graph_shapes(self, max_width: int, decodes: bool) -> list[tuple]:
        """Every (graphs, rows, table width) a pass can replay (warm-up captures them)."""
        return []


def _slot_mapping(meta: PagedMetadata) -> torch.Tensor:
    return meta.slot_mapping


class TritonBackend(ReferenceBackend):
    """The Triton kernels (RoPE with the K/V store, paged and decode attention as each pass's plan
    says) and, with cuda_graph_max_batch > 0, CUDA graphs of the core pass."""

    needs_warm_up = True
    batch_invariant = False
    packs_gqa = True  # short segments' attention items take a GQA group's heads (KernelPlan.pack)
    ops_class = TritonOps

    def __init__(self, mc: ModelConfig, model, pool, cfg: EngineConfig, counters: WorkerCounters):
        from rlt.kernels.attention_steps import num_sms
        from rlt.kernels.kv_copy_triton import finalize_copies
        from rlt.kernels.lane_checks_triton import latent_checks
        from rlt.kernels.lane_rows_triton import lane_rows
        from rlt.kernels.qkv_rope import qkv_rope_write_kv
        from rlt.kernels.rope import rope_write_kv

        super().__init__(mc, model, pool, cfg, counters)
        self.ops, self.slot_kernels = self.ops_class(), triton_slot_kernels()
        self.finalize_copies, self.latent_checks, self._lane_rows = (
            finalize_copies,
            latent_checks,
            lane_rows,
        )

        def attend(cache, layer, meta: PagedMetadata, q, k, v, rotary):
            counters.progress += 1
            r = rotary  # (and the K/V store)
            rope_write_kv(
                q,
                k,
                v,
                r.positions,
                r.inv_freq,
                r.pairs,
                cache,
                layer,
                meta.slot_mapping,
                meta.block_size,
                r.q_bias,
                r.k_bias,
            )
            return kernel_paged_attention(cache, layer, meta, q, k, v)

        def attend_qkv(cache, layer, meta: PagedMetadata, linear, h, w, heads, rotary):
            # one row of a decode pass, rotate-half, no bias: product, RoPE and K/V store in one
            # launch
            r = rotary
            if not (meta.plan.decode and gemv_fits(h, w) and not r.pairs and r.q_bias is None):
                return attend(cache, layer, meta, *split_qkv(linear(h, w), *heads), rotary)
            counters.progress += 1
            slots, bs = meta.slot_mapping, meta.block_size
            q = qkv_rope_write_kv(h, w, heads, r.positions, r.inv_freq, cache, layer, slots, bs)
            return kernel_paged_attention(cache, layer, meta, q, None, None)  # (the decode kernel)

        self.attend, self.attend_qkv = attend, attend_qkv
        # a decode-only pass takes the decode kernel (batch-invariant: the general one, tiles of 16)
        self.decode_plan = KernelPlan() if self.batch_invariant else KernelPlan(decode=True)
        # passes of fewer tiles than fill the GPU (one program per tile and head) split their keys;
        # segments shorter than a tile go in tiles of a GQA group's heads (KernelPlan.pack)
        heads = mc.family_config.num_attention_heads
        self.pack = heads // mc.kv.num_kv_heads if self.packs_gqa else 1
        self.fill_tiles = 0 if self.batch_invariant else -(-num_sms(pool.cache.device) // heads)
        self.decode_graphs = self.pass_graphs = self.prompt_graphs = None
        self.lane_fixed: dict[int, dict] = {}  # lane_meta's fixed tensors, by lane count
        if cfg.cuda_graph_max_batch > 0:
            shape = (model, pool, mc.hidden_size, pool.cache.dtype, pool.cache.device, counters)
            self.decode_graphs = DecodeGraphs(
                *shape, cfg.cuda_graph_max_batch, self.attention, self.decode_plan
            )
            # batch-invariant mode tiles every pass alike (as its eager passes do)
            rows = KERNEL_BLOCK_M if self.batch_invariant else PREFILL_BLOCK_M
            tiles = KernelPlan(rows, fill_tiles=self.fill_tiles, pack=self.pack)
            self.pass_graphs = PassGraphs(*shape, cfg.max_num_batched_tokens, self.attention, tiles)
            if not self.batch_invariant:  # (dense attention's result depends on the chunking)
                rows, pool_ = (
                    min(cfg.max_num_batched_tokens, cfg.prefill_chunk),
                    self.pass_graphs.mempool,
                )
                self.prompt_graphs = PromptGraphs(*shape, rows, self.attention, pool_)

    def plane(self, groups, row_starts, tables) -> PagedMetadata:
        """With the Triton attention's integer metadata for this pass's plan."""
        meta = super().plane(groups, row_starts, tables)
        meta.plan = plan_kernel(
            row_starts, meta.q_starts, self.batch_invariant, self.fill_tiles, self.pack
        )
        meta.kernel = kernel_fields(row_starts, meta.q_starts, meta.plan)
        return meta

    def core_pass(self, active, row_starts, pos, tables) -> CorePass:
        """A graph's replay where one fits: a lone prompt chunk at position 0, decode rows only, else
        any mix up to the largest bucket."""
        n, starts = row_starts[-1], [g.start for g in active]
        d, p, lone = self.decode_graphs, self.pass_graphs, self.prompt_graphs
        if lone is not None and lone.fits(active, n):
            R, ints = lone.inputs(pos, tables[0])
            return CorePass(
                ints,
                lambda t: lone.slots(R, t, n),
                lambda xs, injects, _, t: lone.run(R, xs, injects, t),
            )
        if d is not None and all(g.decoding for g in active) and d.fits(len(active)):
            ints = d.inputs(pos, tables, starts, self.pool.block_size)
            return CorePass(
                ints, lambda t: d.slots(t, n), lambda xs, injects, _, t: d.run(xs, injects, t)
            )
        if p is not None and p.fits(n, len(active)):
            key, ints = p.inputs(pos, tables, row_starts, starts)
            return CorePass(
                ints,
                lambda t: p.slots(key, t, n),
                lambda xs, injects, _, t: p.run(key, xs, injects, t),
            )
        return super().core_pass(active, row_starts, pos, tables)

    def lane_pass(self, x, inject, pos, slot, table):
        if self.decode_graphs is not None and self.decode_graphs.fits(len(x)):
            return self.decode_graphs.run_device(x, inject, pos, slot, table)
        return super().lane_pass(x, inject, pos, slot, table)

    def lane_meta(self, pos, slot, table) -> PagedMetadata:
        n = len(pos)
        fixed = self.lane_fixed.get(n)
        # (once per lane count: one row per segment; a host copy would wait for the device)
        if fixed is None:
            ar = torch.arange(n, device=pos.device)
            work = torch.tensor([1, n], device=pos.device)
            fixed = self.lane_fixed[n] = dict(
                tile_seg=ar,
                tile_row=torch.zeros_like(ar),
                seg_row0=ar,
                seg_rows=torch.ones_like(ar),
                work=work,
            )
        kernel = dict(fixed, seg_q0=pos)  # (positions stay on the device)
        bs = self.pool.block_size  # (q_starts are read by the reference only)
        return PagedMetadata(slot, table, list(range(n + 1)), [0] * n, bs, kernel, self.decode_plan)

    def graph_shapes(self, max_width: int, decodes: bool) -> list[tuple]:
        """Largest first: later, smaller graphs reuse the graph memory. decodes: False on a prefill
        worker (it hands every request off after its first token)."""
        widths = [1 << k for k in range(max_width.bit_length())]
        shapes = []
        if (q := self.prompt_graphs) is not None:  # (the largest: first)
            shapes += [(q, r, 0) for r in reversed(q.buckets)]
        if (p := self.pass_graphs) is not None:
            shapes += [(p, r, w) for r in reversed(p.buckets) for w in reversed(widths)]
        if (d := self.decode_graphs) is not None and decodes:
            largest = next(b for b in BUCKETS if b >= min(d.max_batch, BUCKETS[-1]))
            shapes += [
                (d, b, w) for b in reversed(BUCKETS) if b <= largest for w in reversed(widths)
            ]
        return shapes


class BatchInvariantBackend(TritonBackend):
    """EngineConfig.batch_invariant: PD equal to single, bit for bit."""

    batch_invariant = True
    packs_gqa = False
    ops_class = BatchInvariantOps


def select_backend(device: str, kernels: str, batch_invariant: bool) -> type[ReferenceBackend]:
    """The backend class of a worker on this device with EngineConfig.kernels ("triton": on CUDA;
    the CPU always runs the torch reference) and EngineConfig.batch_invariant (Triton only)."""
    if torch.device(device).type != "cuda" or kernels != "triton":
        return ReferenceBackend
    return BatchInvariantBackend if batch_invariant else TritonBackend
