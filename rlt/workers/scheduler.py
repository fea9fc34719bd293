"""Which requests run, and the KV blocks their rows take.

Requests wait in (priority, arrival) order and are admitted while max_num_seqs allows and the
blocks they hold from the start are free (rlt/workers/sequence.py: admit_positions); one that
already holds its blocks (a PD decode reservation) does not wait behind one that waits for blocks. Each pass a
running request takes the blocks its next rows need. When none are free the lowest priority,
newest running request is preempted: its blocks come back and it waits again, to be resumed by
recompute. A pass that preempted admits nobody (it would only take the blocks back).

With the prefix cache, a request is admitted onto the longest cached prefix of the positions it
knows that need no sampling (a new prompt's all but its last, a resumed request's all but the one
its last token is fed at): it shares those blocks and computes from the first position after them.
While a running request is computing the next block of that prefix, it waits for it instead.
"""

import bisect

from rlt.contract.config import EngineConfig
from rlt.workers.kv_pool import KVPool
from rlt.workers.penalties import PenaltyState
from rlt.workers.prefix_cache import CachedBlock
from rlt.workers.sequence import Sequence


class Scheduler:
    def __init__(self, cfg: EngineConfig, pool: KVPool, penalties: PenaltyState, grammars=None):
        self.cfg, self.pool = cfg, pool
        self.penalties = penalties  # a slot for each running request that is penalized
        # WorkerGrammars: a constrained request waits for its grammar's compile
        self.grammars = grammars
        # (request, 0, end): prompt positions found cached
        self.cached_events: list[tuple[int, int, int]] = []
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.preemptions = 0
        # Blocks freed while work on them may still be queued on the device (abort, stop,
        # preemption): another process must not be given them to write before that work is done.
        self.freed_in_flight = False

    def wait(self, s: Sequence) -> None:
        # (kept in order: a sort per arrival is quadratic in a burst)
        bisect.insort(self.waiting, s, key=_order)

    def remove(self, s: Sequence) -> None:
        if s in self.running:
            self.running.remove(s)
            self.penalties.give(s)
            # its last pass may still be computing (the host runs ahead)
            self.freed_in_flight = True
        else:
            self.waiting.remove(s)
            if (
                self.grammars is not None
                and s.matcher is None
                and s.params.structured_output is not None
            ):
                # (abandons its compile if nobody else waits for it)
                self.grammars.keep(self.waiting)

    def step(self) -> None:
        """Rows and blocks for the next pass; then admission, unless that preempted."""
        if not self.running and self.waiting and self.grammars is not None:
            self.grammars.wait(0.005)  # (only while a grammar compiles)
        if self._schedule() and self._admit():
            self._schedule()

    def admissible(self) -> bool:
        """Could a waiting request be admitted now?"""
        return self._next() is not None

    def _next(self) -> tuple[Sequence, list[CachedBlock]] | None:
        """The next request to admit and its prefix hit: the first waiting one whose blocks are
        free, in order (the head waits for its blocks; later ones wait behind it), or before it any
        that already holds its blocks (a PD decode reservation): it needs none, and the head may be
        waiting for them. One waiting for a running request to cache its next block holds nobody up."""
        if len(self.running) >= self.cfg.max_num_seqs:
            return None
        head = True
        for s in self.waiting:
            if self.grammars is not None and not self.grammars.ready(s):
                continue  # compiling (off the loop): it holds nobody up
            if s.tables is not None:
                return s, []
            # (a preempted one with a token on its way back: resumed once it is read)
            if head and s.feed is None:
                hits = self._hits(s)
                planes = self.pool.num_planes
                need = self.pool.blocks_needed(s.admit_positions) - planes * sum(
                    c.refs > 0 for c in hits
                )
                if need <= self.pool.num_free:
                    if not self._computed_by_another(s, len(hits)):
                        return s, hits
                    continue
            head = False
        return None

    def _computed_by_another(self, s: Sequence, m: int) -> bool:
        """Is its first uncached block, m, one that a running request is computing now (the same
        tokens at the same depths in its prompt)? Then it waits for that block to be cached rather
        than compute it again (a burst of requests sharing a new system prompt computes it once;
        SGLang's in-batch prefix sharing)."""
        bs = self.pool.block_size
        if self.pool.prefix is None or (m + 1) * bs > s.replay_end or s.needs_whole_prompt:
            return False
        key, end = s.keys[m], (m + 1) * bs
        return any(
            not r.decoding
            and r.num_done < end <= r.replay_end
            and r.block_keys(end, r.params.max_loops, bs)[m] == key
            for r in self.running
        )

    def _hits(self, s: Sequence) -> list[CachedBlock]:
        """Its longest cached prefix (looked up again only when the cache's keys have changed: a
        head waiting for blocks is asked every pass)."""
        prefix = self.pool.prefix
        if prefix is None or s.needs_whole_prompt:
            return []
        if s.hits is None or s.hits[0] != (prefix.version, s.replay_end):
            # keys hashed up to the first miss, in doubling runs: a cold prompt's first token does
            # not
            # wait for every block's key (the rest are hashed as its blocks are cached)
            bs = self.pool.block_size
            blocks, n, hits = s.replay_end // bs, 1, []
            while True:
                keys = s.block_keys(min(n, blocks) * bs, s.params.max_loops, bs)
                # (the run's new keys: the earlier ones all hit)
                hits += prefix.match(keys[len(hits) :])
                if len(hits) < len(keys) or len(keys) == blocks:
                    break
                n *= 2
            s.hits = ((prefix.version, s.replay_end), hits)
        return s.hits[1]

    def _admit(self) -> bool:
        """-> whether it admitted any."""
        admitted = False
        while (nxt := self._next()) is not None:
            s, hits = nxt
            self.waiting.remove(s)
            if s.tables is None:
                s.tables = self.pool.allocate(s.admit_positions, hits)
                s.num_cached_blocks, s.num_done = len(hits), len(hits) * self.pool.block_size
                if s.num_cached_tokens is None:  # its first admission
                    s.num_cached_tokens = s.num_done
                    if self.pool.prefix is not None:
                        self.pool.prefix.queried_tokens += len(s.prompt)
                        self.pool.prefix.hit_tokens += s.num_done
                    if s.num_done:
                        self.cached_events.append((s.request_id, 0, s.num_done))
            self.running.append(s)
            self.penalties.take(s)
            admitted = True
        return admitted

    def cache_final(self, s: Sequence) -> None:
        """Its full blocks of final positions whose depths are known go to the prefix cache."""
        if self.pool.prefix is None or s.tables is None:
            return
        keys = s.block_keys(
            min(s.num_done, s.known_positions), s.params.max_loops, self.pool.block_size
        )
        for i in range(s.num_cached_blocks, len(keys)):
            self.pool.cache_block(s.tables, i, keys[i], s.request_id)
        s.num_cached_blocks = max(s.num_cached_blocks, len(keys))

    def _schedule(self) -> bool:
        """Give each running request without rows its next rows, under the row budget, and every row
        its blocks (a row back from steady decode may need one too); False if that preempted."""
        running = self.running
        in_flight = sum(g.n for s in running for g in s.in_flight)
        budget = self.cfg.max_num_batched_tokens - in_flight
        prompt_budget, first_prompt = self._prompt_budget(budget, in_flight)
        # SHARED keeps its meaning only position by position (later positions read earlier
        # positions' final KV at every depth).
        chunk = 1 if self.pool.layout == "shared" else self.cfg.prefill_chunk
        preemptions = self.preemptions
        # a speculation round starts only while few streams decode: past that, rows are no longer
        # free
        speculate = sum(s.decoding for s in running) <= self.cfg.speculative_max_streams
        for s in list(running):  # (this runs every pass: nothing here may cost O(requests))
            if s.tables is None:  # preempted meanwhile
                continue
            rows = budget if s.decoding else min(budget, max(prompt_budget, first_prompt))
            coda = self.pool.has_boundary
            new = (
                s.next_groups(rows, chunk, coda, speculate) if s.group is None and rows > 0 else []
            )
            flying = new or s.in_flight
            if not flying:
                continue
            last = flying[-1]  # its furthest row
            need = last.start + last.n
            if need > self.pool.capacity(s.tables) and not self._make_room(s, need):
                continue
            if new:
                s.take(new)
            taken = sum(g.n for g in new)
            budget -= taken
            if not s.decoding and taken:
                prompt_budget, first_prompt = prompt_budget - taken, 0
        return self.preemptions == preemptions

    def _prompt_budget(self, budget: int, in_flight: int) -> tuple[int, int]:
        """(prompt rows the next pass may add, rows its first prompt may take). Each pass a prompt
        chunk spends in the loop delays every decoding stream's next token: a pass carries at most
        decode_pass_rows rows (the streams' next tokens counted first). While at most half of
        max_num_seqs streams decode, its first prompt may take up to twice that, and twice again
        each time they halve (the rows times the streams they delay stay bounded): a long prompt
        under light load goes whole, not in chunks for a few streams, while short prompts are not
        batched into long passes (each pass's first prompt alone goes past decode_pass_rows)."""
        streams = [s for s in self.running if s.decoding and not s.prefill_only]
        if not streams:
            return budget, budget
        pending = in_flight + sum(not s.in_flight for s in streams)
        rows = self.cfg.decode_pass_rows
        most = rows << max(self.cfg.max_num_seqs // len(streams), 1).bit_length() - 1
        return min(budget, rows - pending), min(budget, most - pending)

    def _make_room(self, s: Sequence, positions: int) -> bool:
        """Preempt until `s` holds `positions`; False if `s` itself was the one preempted."""
        while not self.pool.grow(s.tables, positions):
            victim = max((q for q in self.running if not q.prefill_only), key=lambda q: q.order)
            self.preempt(victim)
            if victim is s:
                return False
        return True

    def preempt(self, s: Sequence) -> None:
        self.remove(s)
        self.cache_final(s)  # resumed, it recomputes only what was evicted meanwhile
        self.pool.free(s.preempt())
        self.preemptions += 1
        self.wait(s)


def _order(s: Sequence):
    return s.order
