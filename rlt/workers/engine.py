"""The loop-level continuous-batching engine every worker runs.

A row is (request, position, depth). Each step runs one pass of the shared core over every active
row, each at its own depth and reading its own KV plane: prompt chunks (chunked, to their request's
max_loops) and decode tokens (until their exit) share the pass. A row group that leaves the loop gets its head
and, where it ends a prompt or is a decode token, is sampled; its request's next group joins the
next pass. Sampled tokens are read back one step late: the next pass (whose new decode rows take
those tokens on the device) is launched first, so the device never waits for the host's
bookkeeping. This module is the step and its bookkeeping; rlt/workers/scheduler.py decides which
requests run and their blocks, rlt/workers/runner.py runs the passes.
"""

import itertools
from dataclasses import dataclass

import torch

from rlt.contract.config import EngineConfig
from rlt.contract.sampling_params import ResolvedParams
from rlt.errors import RequestError
from rlt.models.model_config import ModelConfig
from rlt.workers.backend import select_backend
from rlt.workers.counters import WorkerCounters
from rlt.workers.grammar import WorkerGrammars
from rlt.workers.group import Group
from rlt.workers.kv_pool import BlockTables, KVPool
from rlt.workers.memory import pool_blocks
from rlt.workers.prefix_cache import root_key
from rlt.workers.runner import Runner
from rlt.workers.scheduler import Scheduler
from rlt.workers.sequence import Sequence
from rlt.workers.speculation import round_back, speculated, speculation
from rlt.workers.steady_stretch import SteadyStretches


@dataclass
class StepOutput:
    request_id: int
    token_id: int
    exit_depth: int
    logprobs: dict[int, float] | None
    # None while running (or, prefill-only, handed off for decoding elsewhere)
    finish_reason: str | None
    # with a request's first token: prompt positions the prefix cache held
    num_cached_tokens: int | None = None
    # with a request's first token, if asked: per prompt position
    prompt_logprobs: list | None = None


class LoopEngine(SteadyStretches):
    def __init__(
        self,
        mc: ModelConfig,
        model,
        cfg: EngineConfig,
        dtype: torch.dtype,
        device: str = "cpu",
        counters: WorkerCounters | None = None,
    ):
        """counters: what the worker counts (its progress and first uses), moved by the engine's
        backend and graphs; a fresh one if not given."""
        self.mc, self.cfg = mc, cfg
        self.counters = WorkerCounters() if counters is None else counters
        sized = pool_blocks(mc, model, cfg, dtype, device, type(self), self.counters)
        num_blocks, self.pool_sizing = sized
        self.pool = KVPool(
            mc, cfg.kv_layout, cfg.block_size, num_blocks, dtype, device, cfg.enable_prefix_caching
        )
        # this worker's kernels, chosen once: the model's layers run its operations
        backend = select_backend(device, cfg.kernels, cfg.batch_invariant)
        self.backend = backend(mc, model, self.pool, cfg, self.counters)
        model.ops = self.backend.ops
        self.runner = Runner(mc, model, self.pool, self.backend, device, cfg)
        self.grammars = WorkerGrammars(mc, cfg)  # structured output (rlt/workers/grammar.py)
        self.sched = Scheduler(cfg, self.pool, self.runner.penalties, self.grammars)
        self._arrival = itertools.count()
        self._live: dict[int, Sequence] = {}
        # Disaggregation: a prefill worker keeps a finished prompt's blocks until their transfer is
        # done (held); a decode worker reserves blocks for a prompt being prefilled elsewhere.
        self.held: dict[int, BlockTables] = {}
        self.reserved: dict[int, BlockTables] = {}
        self.chunk_events: list[tuple[int, int, int]] = []  # (request, start, end): positions final
        self._pending: list = []  # callables: read back a launched step's tokens -> outputs
        self._steady = None  # SteadyDecode while a stretch runs
        self._steady_seqs: list[Sequence] = []  # the request of each steady lane
        self.steady_steps = 0  # passes run in steady decode (observability, tests)
        # self-speculation: rounds verified, draft tokens checked, those equal to their targets, the
        # tokens the rounds output
        self.spec_rounds = self.spec_drafts = self.spec_accepted = self.spec_tokens = 0
        self.passes = 0  # core passes run (observability, tests)

    # ---- requests --------------------------------------------------------------------------------
    def _check_live(self, request_id: int) -> None:
        if request_id in self._live or request_id in self.held or request_id in self.reserved:
            raise RequestError(f"request id {request_id!r} is already live")

    def _check_fits(self, request_id: int, prompt_len: int, max_tokens: int) -> None:
        need = self.pool.blocks_needed(prompt_len + max_tokens)
        if need > self.pool.num_blocks:
            raise RequestError(
                f"request {request_id!r} can never fit: prompt {prompt_len} + max_tokens {max_tokens} "
                f"needs {need} KV blocks ({self.pool.num_core_planes + int(self.pool.has_boundary)} planes of "
                f"{self.pool.block_size} positions), the pool has {self.pool.num_blocks}"
            )

    def add_request(
        self,
        request_id: int,
        prompt: list[int],
        params: ResolvedParams,
        priority: int = 0,
        prefill_only: bool = False,
    ) -> None:
        self._check_live(request_id)
        s = Sequence(
            request_id,
            list(prompt),
            params,
            (priority, next(self._arrival)),
            prefill_only=prefill_only,
            root=self._root(params),
            prompt_logprobs=None if params.prompt_logprobs is None else [None],  # (0 has none)
        )
        self._check_fits(request_id, len(prompt), 0 if prefill_only else params.max_tokens)
        s.speculation = None if prefill_only else speculation(params, self.cfg)
        self._live[request_id] = s
        self.sched.wait(s)

    def reserve(self, request_id: int, prompt_len: int, max_tokens: int) -> BlockTables | None:
        """Decode side: blocks for a prompt prefilled elsewhere and its first decode position (None:
        not enough free blocks now); later positions take blocks as they come."""
        self._check_live(request_id)
        self._check_fits(request_id, prompt_len, max_tokens)
        positions = min(prompt_len + 1, prompt_len + max_tokens)
        if self.pool.blocks_needed(positions) > self.pool.num_free:
            return None
        # a peer will write these blocks (NIXL)
        if self.sched.freed_in_flight and self.pool.cache.is_cuda:
            torch.cuda.synchronize(self.pool.cache.device)
        self.sched.freed_in_flight = False
        self.reserved[request_id] = self.pool.allocate(positions)
        return self.reserved[request_id]

    def activate(
        self,
        request_id: int,
        prompt: list[int],
        params: ResolvedParams,
        first_token: int,
        priority: int = 0,
    ) -> None:
        """Decode side: the prompt's KV is in the reserved blocks; continue from its first token."""
        s = Sequence(
            request_id,
            list(prompt),
            params,
            (priority, next(self._arrival)),
            tables=self.reserved.pop(request_id),
            output=[first_token],
            depths=[params.max_loops],  # (its prompt ran, and its first token came, at max_loops)
            num_done=len(prompt),
            root=self._root(params),
            speculation=speculation(params, self.cfg),
        )
        self._live[request_id] = s
        self.sched.wait(s)

    def _root(self, params: ResolvedParams) -> bytes:
        return (
            root_key(self.mc.family_config.random_initial_state, params.state_seed)
            if self.pool.prefix is not None
            else b""
        )

    def tables_of(self, request_id: int) -> BlockTables | None:
        s = self._live.get(request_id)
        return s.tables if s is not None else self.held.get(request_id)

    def release_held(self, request_id: int) -> None:
        tables = self.held.pop(request_id, None)
        if tables is not None:
            self.pool.free(tables)

    def abort(self, request_id: int) -> bool:
        """Idempotent: False if the id is not live. Every block returns at once (the pool is only
        written inside step(); a caller that lets other processes write into it - a decode worker's
        reservation - must know those writes are over)."""
        for store in (self.held, self.reserved):
            if request_id in store:
                self.pool.free(store.pop(request_id))
                return True
        s = self._live.get(request_id)
        if s is None:
            return False
        self.sched.remove(s)
        if s in self._steady_seqs:
            self._steady.deactivate(self._steady_seqs.index(s))
        self._release(s)
        return True

    def _release(self, s: Sequence) -> None:
        self.runner.penalties.give(s)  # (a prefill-only one handed off leaves running here)
        self.sched.cache_final(s)
        if s.tables is not None:
            self.pool.free(s.tables)
            s.tables = None
        s.group, s.replay, s.spec = None, [], None
        del self._live[s.request_id]

    def device_mark(self):
        """On CUDA, an event recorded after the work launched so far (None on the CPU: each step's
        work is done when step() returns)."""
        if not self.pool.cache.is_cuda:
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def running(self) -> list[Sequence]:
        return self.sched.running

    @property
    def waiting(self) -> list[Sequence]:
        return self.sched.waiting

    @property
    def preemptions(self) -> int:
        return self.sched.preemptions

    # ---- one step --------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._pending)

    def step(self) -> list[StepOutput]:
        """Launch one pass, then read back the tokens the previous pass sampled (the device is busy
        with this pass meanwhile) and return them. A request that those tokens finish may already
        have its next token's first loop in this pass: that work is simply dropped.

        While every running request has just one decode row in flight and nothing waits that could
        be admitted, the passes run in steady decode (rlt/workers/steady.py): no host work between
        them at all. Under steady_decode "adaptive" (the default) that needs some request that can
        exit early too: at fixed depth the regular path is faster."""
        self.chunk_events = []
        outputs = self._end_steady() if self._steady is not None and self._steady_must_end() else []
        if self._steady is None:
            self.sched.step()
            self.chunk_events += self.sched.cached_events
            self.sched.cached_events = []
            if self._steady_possible():
                self._start_steady()
        pending, self._pending = self._pending, []
        if self._steady is not None:
            handle, lanes = self._steady.step(), self._steady_seqs
            self.steady_steps += 1
            if handle is not None:
                self._pending.append(lambda: self._resolve_steady(handle, lanes))
        elif groups := self._groups_in_flight():
            result = self.runner.step(groups)
            self.passes += 1
            owner = {id(g): s for s in self.running for g in s.in_flight}
            for g in result.exited:
                s = owner[id(g)]
                if g.exit_depth is not None:
                    s.replayed(g)
                    continue
                if g.draft_of is not None or g.verify_of is not None:
                    speculated(g)
                    s.group = None
                    continue
                s.num_done += g.n
                if not g.decoding:
                    self.chunk_events.append((s.request_id, g.start, g.start + g.n))
                    self.sched.cache_final(s)  # (requests running now may share it)
                s.group = None
            if (plp := result.prompt_logprobs) is not None:  # (read back before the step's tokens)
                asking = [owner[id(g)] for g in plp.groups]
                self._pending.append(lambda: plp.resolve_into(asking))
            if (sampled := result.sampled) is not None:
                seqs = [owner[id(g)] for g in sampled.groups]
                for i, s in enumerate(seqs):
                    s.feed = (sampled, i)
                self._pending.append(lambda: self._resolve_tokens(sampled, seqs))
        return outputs + [o for resolve in pending for o in resolve()]

    def _groups_in_flight(self) -> list[Group]:
        """Every running request's rows for the next pass, in order."""
        return [g for s in self.running for g in s.in_flight]

    def _resolve_tokens(self, tokens, seqs: list[Sequence]) -> list[StepOutput]:
        outputs = []
        for s, smp in zip(seqs, tokens.resolve()):
            # (a later step may have sampled its next one)
            if s.feed is not None and s.feed[0] is tokens:
                s.feed = None
            if self._live.get(s.request_id) is not s:  # aborted or finished meanwhile
                continue
            g = smp.group
            if g.draft_of is not None:
                g.draft_of.tokens[g.start - g.draft_of.start] = smp.token
            elif g.verify_of is None:
                outputs.append(self.append_token(s, smp.token, g.depth, smp.logprobs))
            else:  # a verify row's target: the round's tokens go out once all of them are back
                r = g.verify_of
                r.targets[g.start - r.start] = (smp.token, smp.logprobs)
                if r.ready:
                    outputs += round_back(self, s, r)
        return outputs

    def append_token(self, s: Sequence, tok: int, depth: int, top) -> StepOutput:
        s.output.append(tok)
        s.depths.append(depth)
        p = s.params
        # (a grammar ends at a stop token it took)
        reason, ended = None, self.grammars.accept(s, tok)
        if ended or (not p.ignore_eos and tok in self.mc.eos_token_ids) or tok in p.stop_token_ids:
            reason = "stop"
        elif len(s.output) >= p.max_tokens:
            reason = "length"
        if s.prefill_only:  # handed off: the blocks wait for their transfer, whatever the reason
            self.running.remove(s)
            self.held[s.request_id] = s.tables
            s.tables = None
            self._release(s)
        elif reason is not None:
            self.sched.remove(s)  # (a preempted one waits: its token was on its way back)
            self._release(s)
        first = (s.num_cached_tokens, s.prompt_logprobs) if len(s.output) == 1 else (None, None)
        return StepOutput(s.request_id, tok, depth, top, reason, *first)
