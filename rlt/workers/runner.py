"""Executes one engine step on the device: embed new rows, one core pass over every active row
(each at its own depth, on its own KV plane), exit decisions, LAST_EXITED finalize copies, heads
and batched sampling.

Everything the step needs from the host is packed into one buffer and sent in one copy before the
passes; after the core pass the host reads back one exit mask; everything after that is selected
on the device.
"""

import os
from dataclasses import dataclass, field

import numpy as np
import torch

from rlt.config import ModelConfig
from rlt.control.validation import ResolvedParams
from rlt.kernels.paged_attention import PagedMetadata, kernel_fields, paged_attention, write_kv
from rlt.kernels.sampler import SamplingTensors, sample, top_logprobs
from rlt.workers.exit_policy import should_exit, update_survival
from rlt.workers.kv_pool import BlockTables, KVPool
from rlt.workers.step_buffers import StepBuffers


@dataclass
class Group:
    """Rows of one request moving through the loop together (a prompt chunk or a decode token)."""

    ids: list[int]
    start: int  # position of the first row
    tables: BlockTables
    params: ResolvedParams
    decoding: bool
    samples: bool  # ends the prompt, or is a decode token
    output_index: int  # index of the token this group samples
    depth: int = 0  # loops done
    inject: torch.Tensor | None = None
    state: torch.Tensor | None = None
    survival: torch.Tensor | None = None  # [1] prod(1 - hazard), decode groups

    @property
    def n(self) -> int:
        return len(self.ids)


@dataclass
class Sampled:
    group: Group
    token: int
    logprobs: dict[int, float] | None


@dataclass
class StepResult:
    exited: list[Group] = field(default_factory=list)
    sampled: list[Sampled] = field(default_factory=list)


class _Attention:
    """The models' Attention interface over the paged pool, for one pass."""

    def __init__(self, cache, core: PagedMetadata | None, boundary: PagedMetadata | None):
        self.cache, self.core_meta, self.boundary_meta = cache, core, boundary

    def core(self, layer, q, k, v):
        write_kv(self.cache, layer, self.core_meta, k, v)
        return paged_attention(self.cache, layer, self.core_meta, q)

    def boundary(self, layer, q, k, v):
        write_kv(self.cache, layer, self.boundary_meta, k, v)
        return paged_attention(self.cache, layer, self.boundary_meta, q)


def _slots(table: list[int], start: int, n: int, bs: int) -> list[int]:
    return [table[p // bs] * bs + p % bs for p in range(start, start + n)]


def new_prompt_rows(groups: list[Group]) -> bool:
    """Any prompt chunk in the pass (CUDA graphs capture decode-only passes: one row per group)."""
    return any(not g.decoding for g in groups)


def _padded(tables: list[list[int]]) -> np.ndarray:
    out = np.zeros((len(tables), max(1, max(len(t) for t in tables))), dtype=np.int64)
    for i, t in enumerate(tables):
        out[i, :len(t)] = t
    return out


class Runner:
    def __init__(self, mc: ModelConfig, model, pool: KVPool, device: str, cuda_graph_max_batch: int = 0):
        self.mc, self.model, self.pool, self.device = mc, model, pool, device
        self.buffers = StepBuffers(device)
        # CUDA runs the Triton attention; RLT_TORCH_ATTENTION=1 keeps the reference (for comparisons).
        self.use_kernels = torch.device(device).type == "cuda" and os.environ.get("RLT_TORCH_ATTENTION") != "1"
        self.graphs = None
        if self.use_kernels and cuda_graph_max_batch > 0:
            from rlt.workers.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(model, pool, mc.hidden_size, pool.cache.dtype, device, cuda_graph_max_batch,
                                       _Attention)

    def _kernel_fields(self, prefix: str, groups, row_starts) -> dict:
        """On CUDA, the Triton attention's integer metadata, packed with the rest of the step."""
        if not self.use_kernels:
            return {}
        fields = kernel_fields(row_starts, [g.start for g in groups])
        return {prefix + k: v for k, v in fields.items()}

    def _meta(self, slots, tables, groups, row_starts, t=None, prefix="") -> PagedMetadata:
        kernel = None
        if self.use_kernels:
            if t is None:  # selected after the pass: a small extra copy
                t = {prefix + k: torch.from_numpy(v).to(self.device)
                     for k, v in kernel_fields(row_starts, [g.start for g in groups]).items()}
            kernel = {k[len(prefix):]: v for k, v in t.items() if k.startswith(prefix)}
        return PagedMetadata(slots, tables, row_starts, [g.start for g in groups], self.pool.block_size, kernel)

    @torch.inference_mode()
    def step(self, active: list[Group]) -> StepResult:
        pool, bs, D = self.pool, self.pool.block_size, self.mc.depth
        new = [g for g in active if g.state is None]
        boundary = pool.has_boundary

        def rows(gs):
            return np.cumsum([0] + [g.n for g in gs]).tolist()

        ra, rn = rows(active), rows(new)  # row offsets of each group in the pass / among new groups

        # ---- pack the step's metadata: one host-to-device copy ----------------------------------
        f = {"pos": np.concatenate([np.arange(g.start, g.start + g.n) for g in active]),
             "core_slot": np.array(sum((_slots(g.tables.core[pool.plane_of(g.depth + 1)], g.start, g.n, bs)
                                        for g in active), []), dtype=np.int64),
             "core_table": _padded([g.tables.core[pool.plane_of(g.depth + 1)] for g in active]),
             "depth_next": np.array([g.depth + 1 for g in active]),
             "decoding": np.array([g.decoding for g in active]),
             "min_loops": np.array([g.params.min_loops for g in active]),
             "max_loops": np.array([g.params.max_loops for g in active]),
             "threshold": np.array([g.params.exit_threshold for g in active], dtype=np.float32),
             "last_row": np.array(ra[1:]) - 1,
             "row_group": np.repeat(np.arange(len(active)), [g.n for g in active]),
             "samples": np.array([g.samples for g in active]),
             "temperature": np.array([g.params.temperature for g in active], dtype=np.float32),
             "top_k": np.array([g.params.top_k for g in active]),
             "top_p": np.array([g.params.top_p for g in active], dtype=np.float32),
             "seed": np.array([g.params.sampling_seed for g in active]),
             "output_index": np.array([g.output_index for g in active]),
             # slot of each group's last row in every core plane (LAST_EXITED finalize copies)
             "plane_slot": np.array([[t[(g.start + g.n - 1) // bs] * bs + (g.start + g.n - 1) % bs
                                      for t in g.tables.core] for g in active], dtype=np.int64),
             **self._kernel_fields("core_k_", active, ra)}
        if new:
            f |= {"new_ids": np.array(sum((g.ids for g in new), []), dtype=np.int64),
                  "new_pos": np.concatenate([np.arange(g.start, g.start + g.n) for g in new]),
                  "new_seed": np.concatenate([np.full(g.n, g.params.state_seed, dtype=np.int64) for g in new])}
        if boundary:
            f |= {"bnd_slot": np.array(sum((_slots(g.tables.boundary, g.start, g.n, bs) for g in active), []),
                                       dtype=np.int64),
                  "bnd_table": _padded([g.tables.boundary for g in active])}
            if new:
                f["new_bnd_slot"] = np.array(sum((_slots(g.tables.boundary, g.start, g.n, bs) for g in new), []),
                                             dtype=np.int64)
                f["new_bnd_table"] = _padded([g.tables.boundary for g in new])
                f |= self._kernel_fields("new_bnd_k_", new, rn)
        t = self.buffers.pack(f)

        # ---- embed (Huginn: prelude, boundary KV) and initial state of new rows ---------------------
        if new:
            meta = self._meta(t["new_bnd_slot"], t["new_bnd_table"], new, rn, t, "new_bnd_k_") \
                if boundary else None
            inject = self.model.embed(t["new_ids"], t["new_pos"], _Attention(pool.cache, None, meta))
            state = self.model.initial_state(inject, t["new_pos"], t["new_seed"])
            for g, r0, r1 in zip(new, rn, rn[1:]):
                g.inject, g.state = inject[r0:r1], state[r0:r1]
                if g.decoding:
                    g.survival = torch.ones(1, device=self.device)

        # ---- one pass of the core over every active row ----------------------------------------------
        x_in, inject_in = torch.cat([g.state for g in active]), torch.cat([g.inject for g in active])
        if self.graphs is not None and not new_prompt_rows(active) and self.graphs.fits(len(active)):
            x, gate = self.graphs.run(x_in, inject_in, t["pos"], t["core_slot"], t["core_table"])
        else:
            core_meta = self._meta(t["core_slot"], t["core_table"], active, ra, t, "core_k_")
            x, gate = self.model.loop(x_in, inject_in, t["pos"], _Attention(pool.cache, core_meta, None))
        surv = torch.cat([g.survival if g.decoding else torch.ones(1, device=self.device) for g in active])
        if gate is not None:
            surv = update_survival(surv, gate[t["last_row"]])  # decode groups are single rows
        decoding = t["decoding"].bool()
        done = torch.where(decoding, should_exit(t["depth_next"], surv, t["min_loops"], t["max_loops"],
                                                 t["threshold"]), t["depth_next"] >= D)
        for g, r0, r1, s in zip(active, ra, ra[1:], surv.split(1)):
            g.state, g.depth = x[r0:r1], g.depth + 1
            if g.decoding:
                g.survival = s
        # Read the exit mask back only if some row's exit depends on its gate at this depth;
        # otherwise the host knows it and runs ahead to the next step while the GPU works.
        if any(g.decoding and g.params.exit_threshold < 1.0 and g.params.min_loops <= g.depth < g.params.max_loops
               for g in active):
            done_host = done.tolist()
        else:
            done_host = [g.depth >= (g.params.max_loops if g.decoding else D) for g in active]
        result = StepResult(exited=[g for g, d in zip(active, done_host) if d])
        if not result.exited:
            return result
        done_idx = done.nonzero().squeeze(1)
        self._finalize(t, done & decoding & (t["depth_next"] < D))
        self._head_and_sample(t, active, done, done_idx, result)
        return result

    def _finalize(self, t, mask: torch.Tensor) -> None:
        """LAST_EXITED: copy each exited decode token's depth-e K/V into planes e+1..D (all core layers)."""
        if self.pool.layout != "last_exited":
            return
        planes = torch.arange(t["plane_slot"].shape[1], device=self.device)
        copy = mask.unsqueeze(1) & (planes.unsqueeze(0) >= t["depth_next"].unsqueeze(1))  # [G, planes]
        if not bool(copy.any()):
            return
        src = t["plane_slot"].gather(1, (t["depth_next"] - 1).unsqueeze(1)).expand_as(copy)[copy]
        dst = t["plane_slot"][copy]
        bs, c = self.pool.block_size, self.pool.cache
        c[dst // bs, :, :, dst % bs] = c[src // bs, :, :, src % bs]

    def _head_and_sample(self, t, active, done, done_idx, result: StepResult) -> None:
        exited = result.exited
        sampling = [g for g in exited if g.samples]
        samples_mask = t["samples"].bool()
        if self.pool.has_boundary:  # Huginn: the coda writes boundary KV for every exited row
            row_mask = done[t["row_group"]]
            sel_rows = row_mask.nonzero().squeeze(1)
            new_index = row_mask.cumsum(0) - 1
            row_starts = np.cumsum([0] + [g.n for g in exited]).tolist()
            meta = self._meta(t["bnd_slot"][sel_rows], t["bnd_table"][done_idx], exited, row_starts)
            pick = done & samples_mask if sampling else None
            select = new_index[t["last_row"][pick]] if sampling else torch.zeros(0, dtype=torch.long)
            logits = self.model.head(torch.cat([g.state for g in exited]), t["pos"][sel_rows],
                                     _Attention(self.pool.cache, None, meta), select)
        elif sampling:
            pick = done & samples_mask
            logits = self.model.head(torch.cat([g.state[-1:] for g in sampling]), t["pos"][t["last_row"][pick]],
                                     None)
        if not sampling:
            return
        st = SamplingTensors(t["temperature"][pick], t["top_k"][pick], t["top_p"][pick], t["seed"][pick],
                             t["output_index"][pick])
        tokens = sample(logits, st).tolist()
        k = max(g.params.logprobs for g in sampling)
        vals, ids = top_logprobs(logits, k) if k else (None, None)
        vals, ids = (vals.tolist(), ids.tolist()) if k else (None, None)
        for i, (g, tok) in enumerate(zip(sampling, tokens)):
            lp = dict(zip(ids[i][: g.params.logprobs], vals[i][: g.params.logprobs])) if g.params.logprobs else None
            result.sampled.append(Sampled(g, tok, lp))
