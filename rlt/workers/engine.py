"""The loop-level continuous-batching engine every worker runs.

A row is (request, position, depth). Each step runs one pass of the shared core over every active
row, each at its own depth and reading its own KV plane: prompt chunks (full depth, chunked) and
decode tokens (until their exit) share the pass. A row group that leaves the loop gets its head
and, where it ends a prompt or is a decode token, is sampled; its slot is refilled next step.
"""

import itertools
from dataclasses import dataclass, field

import torch

from rlt.config import ModelConfig
from rlt.control.validation import ResolvedParams
from rlt.errors import RequestError
from rlt.kernels.paged_attention import PagedMetadata, PagedSegment, paged_attention, write_kv
from rlt.kernels.sampler import SamplingTensors, sample, top_logprobs
from rlt.workers.exit_policy import should_exit, update_survival
from rlt.workers.kv_pool import BlockTables, KVPool


@dataclass
class EngineConfig:
    kv_layout: str = "last_exited"
    block_size: int = 16
    num_blocks: int | None = None  # None: sized from kv_memory_bytes
    kv_memory_bytes: int = 1 << 30
    max_num_seqs: int = 64
    prefill_chunk: int = 256  # prompt rows per request per chunk
    max_num_batched_tokens: int = 2048  # rows per core pass


@dataclass
class StepOutput:
    request_id: str
    token_id: int
    exit_depth: int
    logprobs: dict[int, float] | None
    finish_reason: str | None  # None while running


@dataclass
class _Group:
    """Rows of one request moving through the loop together."""

    ids: torch.Tensor
    positions: torch.Tensor
    inject: torch.Tensor | None = None
    state: torch.Tensor | None = None
    depth: int = 0  # loops done
    survival: torch.Tensor | None = None  # decode only: prod(1 - hazard)
    samples: bool = False  # last prompt chunk, or a decode token


@dataclass
class _Seq:
    request_id: str
    prompt: list[int]
    params: ResolvedParams
    order: tuple
    tables: BlockTables | None = None
    output: list[int] = field(default_factory=list)
    num_done: int = 0  # positions whose KV is final on every plane
    group: _Group | None = None

    @property
    def decoding(self) -> bool:
        return self.num_done >= len(self.prompt)


class _Attention:
    """The models' Attention interface over the paged pool, for one pass."""

    def __init__(self, pool: KVPool, core: PagedMetadata | None, boundary: PagedMetadata | None):
        self.cache, self.core_meta, self.boundary_meta = pool.cache, core, boundary

    def core(self, layer, q, k, v):
        write_kv(self.cache, layer, self.core_meta, k, v)
        return paged_attention(self.cache, layer, self.core_meta, q)

    def boundary(self, layer, q, k, v):
        write_kv(self.cache, layer, self.boundary_meta, k, v)
        return paged_attention(self.cache, layer, self.boundary_meta, q)


class LoopEngine:
    def __init__(self, mc: ModelConfig, model, cfg: EngineConfig, dtype: torch.dtype, device: str = "cpu"):
        self.mc, self.model, self.cfg, self.device = mc, model, cfg, device
        if cfg.block_size < 1 or cfg.max_num_seqs < 1 or cfg.prefill_chunk < 1:
            raise ValueError("block_size, max_num_seqs and prefill_chunk must be >= 1")
        num_blocks = cfg.num_blocks
        if num_blocks is None:
            per_block = mc.kv.bytes_per_token(1, torch.finfo(dtype).bits // 8) * cfg.block_size
            num_blocks = max(1, min(65536, cfg.kv_memory_bytes // per_block))
        self.pool = KVPool(mc, cfg.kv_layout, cfg.block_size, num_blocks, dtype, device)
        self.waiting: list[_Seq] = []
        self.running: list[_Seq] = []
        self._arrival = itertools.count()
        self._ids: set[str] = set()

    # ---- requests ---------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: list[int], params: ResolvedParams, priority: int = 0) -> None:
        if request_id in self._ids:
            raise RequestError(f"request id {request_id!r} is already live")
        need = self.pool.blocks_needed(len(prompt) + params.max_tokens)
        if need > self.pool.num_blocks:
            raise RequestError(
                f"request {request_id!r} can never fit: prompt {len(prompt)} + max_tokens {params.max_tokens} "
                f"needs {need} KV blocks ({self.pool.num_core_planes + int(self.pool.has_boundary)} planes of "
                f"{self.pool.block_size} positions), the pool has {self.pool.num_blocks}")
        self._ids.add(request_id)
        self.waiting.append(_Seq(request_id, list(prompt), params, (priority, next(self._arrival))))
        self.waiting.sort(key=lambda s: s.order)

    def abort(self, request_id: str) -> bool:
        """Idempotent: False if the id is not live."""
        for queue in (self.waiting, self.running):
            for s in queue:
                if s.request_id == request_id:
                    queue.remove(s)
                    self._release(s)
                    return True
        return False

    def _release(self, s: _Seq) -> None:
        if s.tables is not None:
            self.pool.free(s.tables)
            s.tables = None
        s.group = None
        self._ids.discard(s.request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    # ---- one step -----------------------------------------------------------------------------
    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:
            s = self.waiting[0]
            if self.pool.blocks_needed(len(s.prompt) + s.params.max_tokens) > self.pool.num_free:
                break  # FCFS: the head waits for blocks
            s.tables = self.pool.allocate(len(s.prompt) + s.params.max_tokens)
            self.running.append(self.waiting.pop(0))

    def _schedule_new_groups(self) -> list[_Seq]:
        budget = self.cfg.max_num_batched_tokens - sum(len(s.group.ids) for s in self.running if s.group)
        new = []
        for s in self.running:
            if s.group is not None or budget <= 0:
                continue
            if s.decoding:
                ids = [s.output[-1]]
            else:
                # SHARED keeps its meaning only position by position (later positions read earlier
                # positions' final KV at every depth).
                chunk = 1 if self.pool.layout == "shared" else self.cfg.prefill_chunk
                n = min(chunk, len(s.prompt) - s.num_done, budget)
                ids = s.prompt[s.num_done:s.num_done + n]
            budget -= len(ids)
            pos = torch.arange(s.num_done, s.num_done + len(ids), device=self.device)
            s.group = _Group(torch.tensor(ids, device=self.device), pos,
                             samples=s.decoding or s.num_done + len(ids) == len(s.prompt))
            if s.decoding:
                s.group.survival = torch.ones(1, device=self.device)
            new.append(s)
        return new

    def _metadata(self, seqs: list[_Seq], plane_of) -> PagedMetadata:
        bs = self.pool.block_size
        blocks, offsets, segments, row = [], [], [], 0
        for s in seqs:
            table = plane_of(s)
            start, n = int(s.group.positions[0]), len(s.group.ids)
            for p in range(start, start + n):
                blocks.append(table[p // bs])
                offsets.append(p % bs)
            kv_len = start + n
            segments.append(PagedSegment(row, row + n, start, torch.tensor(table[: -(-kv_len // bs)]), kv_len))
            row += n
        return PagedMetadata(torch.tensor(blocks), torch.tensor(offsets), segments)

    def _boundary_meta(self, seqs):
        return self._metadata(seqs, lambda s: s.tables.boundary) if self.pool.has_boundary else None

    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        self._admit()
        new = self._schedule_new_groups()
        if new:
            ids = torch.cat([s.group.ids for s in new])
            pos = torch.cat([s.group.positions for s in new])
            seeds = torch.cat([torch.full_like(s.group.positions, s.params.state_seed) for s in new])
            inject = self.model.embed(ids, pos, _Attention(self.pool, None, self._boundary_meta(new)))
            state = self.model.initial_state(inject, pos, seeds)
            row = 0
            for s in new:
                n = len(s.group.ids)
                s.group.inject, s.group.state = inject[row:row + n], state[row:row + n]
                row += n

        active = [s for s in self.running if s.group is not None]
        if not active:
            return []
        pool = self.pool
        meta = self._metadata(active, lambda s: s.tables.core[pool.plane_of(s.group.depth + 1)])
        x, gate = self.model.loop(torch.cat([s.group.state for s in active]),
                                  torch.cat([s.group.inject for s in active]),
                                  torch.cat([s.group.positions for s in active]), _Attention(pool, meta, None))
        row, exited = 0, []
        D = self.mc.depth
        decode = [s for s in active if s.decoding]
        for s in active:
            g, n = s.group, len(s.group.ids)
            g.state, g.depth = x[row:row + n], g.depth + 1
            if gate is not None and s.decoding:
                g.survival = update_survival(g.survival, gate[row:row + n])
            row += n
            if not s.decoding and g.depth == D:
                exited.append(s)
        if decode:
            t = lambda vals, dt=None: torch.tensor(vals, dtype=dt, device=self.device)  # noqa: E731
            done = should_exit(t([s.group.depth for s in decode]), torch.cat([s.group.survival for s in decode]),
                               t([s.params.min_loops for s in decode]), t([s.params.max_loops for s in decode]),
                               t([s.params.exit_threshold for s in decode], torch.float32))
            exited += [s for s, d in zip(decode, done.tolist()) if d]
        if not exited:
            return []
        self._finalize_exits([s for s in exited if s.decoding and s.group.depth < D])
        return self._head_and_sample(exited)

    def _finalize_exits(self, seqs: list[_Seq]) -> None:
        """LAST_EXITED: copy each exited token's depth-e K/V into planes e+1..D (all core layers)."""
        if self.pool.layout != "last_exited" or not seqs:
            return
        bs, src_b, src_o, dst_b, dst_o = self.pool.block_size, [], [], [], []
        for s in seqs:
            p, e = int(s.group.positions[0]), s.group.depth
            for plane in range(e, self.mc.depth):
                src_b.append(s.tables.core[e - 1][p // bs])
                dst_b.append(s.tables.core[plane][p // bs])
                src_o.append(p % bs)
                dst_o.append(p % bs)
        c = self.pool.cache
        c[torch.tensor(dst_b), :, :, torch.tensor(dst_o)] = c[torch.tensor(src_b), :, :, torch.tensor(src_o)]

    def _head_and_sample(self, exited: list[_Seq]) -> list[StepOutput]:
        all_rows = self.pool.has_boundary  # Huginn's coda writes KV for every row
        heads = exited if all_rows else [s for s in exited if s.group.samples]
        sampling = [s for s in exited if s.group.samples]
        logits = None
        if heads:
            select, row = [], 0
            for s in heads:
                n = len(s.group.ids) if all_rows else 1
                if s.group.samples:
                    select.append(row + n - 1)
                row += n
            states = torch.cat([s.group.state if all_rows else s.group.state[-1:] for s in heads])
            positions = torch.cat([s.group.positions if all_rows else s.group.positions[-1:] for s in heads])
            attn = _Attention(self.pool, None, self._boundary_meta(heads))
            logits = self.model.head(states, positions, attn, torch.tensor(select, dtype=torch.long))
        outputs = []
        if sampling:
            t = lambda vals, dt: torch.tensor(vals, dtype=dt, device=self.device)  # noqa: E731
            P = [s.params for s in sampling]
            st = SamplingTensors(t([p.temperature for p in P], torch.float32), t([p.top_k for p in P], torch.int64),
                                 t([p.top_p for p in P], torch.float32), t([p.sampling_seed for p in P], torch.int64),
                                 t([len(s.output) for s in sampling], torch.int64))
            tokens = sample(logits, st).tolist()
            k = max(p.logprobs for p in P)
            lp = top_logprobs(logits, k) if k else None
            for i, (s, tok) in enumerate(zip(sampling, tokens)):
                top = None
                if s.params.logprobs:
                    top = dict(zip(lp[1][i, : s.params.logprobs].tolist(), lp[0][i, : s.params.logprobs].tolist()))
                outputs.append(self._append_token(s, tok, s.group.depth, top))
        for s in exited:
            if s.group is not None:
                s.num_done += len(s.group.ids)
                s.group = None
        return outputs

    def _append_token(self, s: _Seq, tok: int, depth: int, top) -> StepOutput:
        s.output.append(tok)
        p = s.params
        reason = None
        if (not p.ignore_eos and tok in self.mc.eos_token_ids) or tok in p.stop_token_ids:
            reason = "stop"
        elif len(s.output) >= p.max_tokens:
            reason = "length"
        if reason is not None:
            self.running.remove(s)
            s.num_done += len(s.group.ids)
            self._release(s)
        return StepOutput(s.request_id, tok, depth, top, reason)
