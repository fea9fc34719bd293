"""The worker's main loop: control messages in, one engine step, one Outputs message out; plus
the role-specific work of disaggregation (a prefill worker posts KV writes and reports them done,
a decode worker reserves blocks, counts chunk notifications and activates)."""

import time
from dataclasses import dataclass, field

from rlt.contract import protocol as pr
from rlt.errors import RequestError
from rlt.workers.kv_transfer import TransferError


@dataclass
class _Outgoing:
    """Prefill worker: one prompt being written into a decode worker's blocks."""

    dst_agent: str
    dst_tables: list[list[int]]
    dst_gen: int  # the generation the decode worker knows it by (its notifications name it)
    seq: int = 0
    pending: list = field(default_factory=list)  # (handle, posted_at)
    prompt_done: bool = False
    bytes: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass
class _Incoming:
    """Decode worker: a reservation waiting for its chunks and the coordinator's Activate."""

    seqs: set = field(default_factory=set)
    activate: pr.Activate | None = None
    deadline: float = 0.0


class Worker:
    def __init__(self, sock, engine, role: str, transport, transfer_timeout: float):
        self.sock, self.engine, self.role, self.transport = sock, engine, role, transport
        self.transfer_timeout = transfer_timeout
        self.outgoing: dict[int, _Outgoing] = {}
        self.draining: dict[int, tuple[_Outgoing, list]] = {}  # retired: writes in flight, replies after
        self.incoming: dict[int, _Incoming] = {}
        self.pending_reserves: list[pr.Reserve] = []
        # Prefill: each step's chunk events with a device event recorded after its pass; a write
        # is posted once its pass is done (NIXL copies outside the compute stream).
        self.unposted: list[tuple[object | None, list]] = []
        self.started: list[int] = []
        self.changed = False
        self.counters = c = engine.counters
        self.first_use_at_ready = (c.captures, c.compiles)  # (built when READY is sent)
        c.ready = True

    def send(self, msg) -> None:
        self.sock.send(pr.encoder.encode(msg))

    def stats(self) -> pr.Stats:
        e, prefix = self.engine, self.engine.pool.prefix
        return pr.Stats(
            len(e.running) + len(e.held) + len(e.reserved) + len(self.pending_reserves),
            len(e.waiting),
            e.num_free_blocks,
            e.preemptions,
            self.counters.captures - self.first_use_at_ready[0],
            self.counters.compiles - self.first_use_at_ready[1],
            prefix.queried_tokens if prefix is not None else 0,
            prefix.hit_tokens if prefix is not None else 0,
            e.pool.num_cached,
            e.spec_rounds,
            e.spec_drafts,
            e.spec_accepted,
        )

    def cache_events(self) -> pr.CacheEvents | None:
        """The prefix cache's inserts and evictions since the last message, if watched (a few bytes
        a block: the coordinator has the tokens)."""
        prefix = self.engine.pool.prefix
        events = prefix.take_events() if prefix is not None and prefix.stored is not None else None
        return pr.CacheEvents(*events) if events is not None else None

    def busy(self) -> bool:
        return self.engine.has_work() or bool(self.outgoing or self.draining or self.incoming or self.pending_reserves)

    # ---- control messages ---------------------------------------------------------------------
    def handle(self, msg) -> bool:
        self.changed = True
        e = self.engine
        if isinstance(msg, pr.Add):
            try:
                e.add_request(msg.gen, msg.prompt, msg.params, msg.priority)
            except RequestError as err:
                self.send(pr.Failed(msg.gen, str(err)))
        elif isinstance(msg, pr.Abort):
            for gen in msg.gens:
                self.incoming.pop(gen, None)
                self.pending_reserves = [r for r in self.pending_reserves if r.gen != gen]
                e.abort(gen)
        elif isinstance(msg, pr.Connect):
            for peer in msg.peers:
                self.transport.add_peer(peer)
        elif isinstance(msg, pr.Reserve):
            self.pending_reserves.append(msg)
            self._try_reserve()
        elif isinstance(msg, pr.Prefill):
            try:
                e.add_request(msg.gen, msg.prompt, msg.params, msg.priority, prefill_only=True)
                dst_gen = msg.gen if msg.dst_gen is None else msg.dst_gen
                self.outgoing[msg.gen] = _Outgoing(msg.dst_agent, msg.dst_tables, dst_gen)
                self.started.append(msg.gen)
            except RequestError as err:
                self.send(pr.Failed(msg.gen, str(err)))
        elif isinstance(msg, pr.Cancel):
            self._retire(msg.gen, pr.Drained(msg.gen))
        elif isinstance(msg, pr.Activate):
            inc = self.incoming.get(msg.gen)
            if inc is not None:  # else: aborted meanwhile
                inc.activate, inc.deadline = msg, time.monotonic() + self.transfer_timeout
                self._try_activate(msg.gen)
        elif isinstance(msg, pr.Shutdown):
            return False
        return True

    # ---- decode side ----------------------------------------------------------------------------
    def _try_reserve(self) -> None:
        while self.pending_reserves:
            r = self.pending_reserves[0]
            try:
                tables = self.engine.reserve(r.gen, r.prompt_len, r.max_tokens)
            except RequestError as err:
                self.pending_reserves.pop(0)
                self.send(pr.Failed(r.gen, str(err)))
                continue
            if tables is None:
                return  # FCFS: wait for blocks
            self.pending_reserves.pop(0)
            self.incoming[r.gen] = _Incoming()
            self.send(pr.Reserved(r.gen, tables.planes))
            self.changed = True

    def _try_activate(self, gen: int) -> None:
        inc = self.incoming[gen]
        a = inc.activate
        if a is not None and inc.seqs >= set(range(a.chunks)):
            del self.incoming[gen]
            self.engine.activate(gen, a.prompt, a.params, a.first_token, a.priority)

    def _decode_progress(self) -> None:
        for gen, seq in self.transport.notifications():
            inc = self.incoming.get(gen)
            if inc is not None:  # notifications of retired generations are dropped
                inc.seqs.add(seq)
                self._try_activate(gen)
        now = time.monotonic()
        for gen, inc in list(self.incoming.items()):
            if inc.activate is not None and now > inc.deadline:
                # The prefill worker reported every write done, so none can still land: free.
                del self.incoming[gen]
                self.engine.abort(gen)
                self.changed = True
                self.send(
                    pr.Failed(
                        gen,
                        f"KV transfer incomplete: {len(inc.seqs)} of {inc.activate.chunks} "
                        f"chunks arrived within {self.transfer_timeout} s",
                    )
                )
        if self.pending_reserves:
            self._try_reserve()

    # ---- prefill side ---------------------------------------------------------------------------
    def _retire(self, gen: int, reply) -> None:
        """Stop a generation and send `reply` (Drained, Failed) once none of its writes can still
        land: done, failed or past the deadline. The decode worker frees their destination only
        after that reply; the loop never waits for it (_prefill_progress polls). Its source blocks
        are freed at once: a write still reading them lands only in its own reservation."""
        self.engine.abort(gen)
        o = self.outgoing.pop(gen, None)
        if gen in self.draining:
            self.draining[gen][1].append(reply)
        elif o is not None and o.pending:
            self.draining[gen] = (o, [reply])
        else:
            self.send(reply)
        self.changed = True

    def _fail(self, gen: int, error: str) -> None:
        self._retire(gen, pr.Failed(gen, error))

    def _queue_chunks(self) -> None:
        """This step's chunk events, to be written once the device has run the step's pass."""
        events, self.engine.chunk_events = self.engine.chunk_events, []
        if events:
            self.unposted.append((self.engine.device_mark(), events))
        while self.unposted and (self.unposted[0][0] is None or self.unposted[0][0].query()):
            self._post_chunks(self.unposted.pop(0)[1])

    def _awaits_device(self, gen: int) -> bool:
        """A chunk of `gen` is queued behind a pass the device has not finished."""
        return any(g == gen for _, events in self.unposted for g, _, _ in events)

    def _post_chunks(self, events) -> None:
        bs = self.engine.pool.block_size
        for gen, start, end in events:
            o = self.outgoing.get(gen)
            tables = self.engine.tables_of(gen)
            if o is None or tables is None:  # retired meanwhile
                continue
            b0, b1 = start // bs, (end - 1) // bs + 1
            src = [b for t in tables.planes for b in t[b0:b1]]
            dst = [b for t in o.dst_tables for b in t[b0:b1]]
            try:
                h = self.transport.write(o.dst_agent, src, dst, f"{o.dst_gen}:{o.seq}".encode())
            except TransferError as err:
                self._fail(gen, str(err))
                continue
            o.pending.append((h, time.monotonic()))
            o.seq += 1
            o.bytes += len(src) * self.transport.block_bytes

    def _prefill_progress(self) -> None:
        now = time.monotonic()
        for gen, (o, replies) in list(self.draining.items()):
            o.pending = [(h, t) for h, t in o.pending if not self._ended(h, now - t)]
            if not o.pending:
                del self.draining[gen]
                for reply in replies:
                    self.send(reply)
                self.changed = True
        for gen, o in list(self.outgoing.items()):
            try:
                still = []
                for h, posted in o.pending:
                    if self.transport.poll(h):
                        self.transport.release(h)
                    elif now - posted > self.transfer_timeout:
                        raise TransferError(f"KV write past its deadline ({self.transfer_timeout} s)")
                    else:
                        still.append((h, posted))
                o.pending = still
            except TransferError as err:
                self._fail(gen, str(err))
                continue
            if o.prompt_done and not o.pending and not self._awaits_device(gen):
                del self.outgoing[gen]
                self.engine.release_held(gen)
                self.send(pr.TransferDone(gen, o.seq, o.bytes, time.monotonic() - o.started))
                self.changed = True

    def _ended(self, handle, age: float) -> bool:
        """A retired generation's write: done, failed or past its deadline (then released)."""
        try:
            ended = self.transport.poll(handle) or age > self.transfer_timeout
        except TransferError:
            ended = True
        if ended:
            self.transport.release(handle)
        return ended

    # ---- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        while True:
            self.changed = False
            self.counters.progress += 1
            self.counters.busy = self.busy()
            timeout = 0 if self.engine.has_work() else (1 if self.counters.busy else 50)
            while self.sock.poll(timeout):
                timeout = 0
                if not self.handle(pr.to_worker.decode(self.sock.recv())):
                    return
            tokens = []
            if self.engine.has_work():
                outs = self.engine.step()
                tokens = [
                    pr.Token(
                        o.request_id,
                        o.token_id,
                        o.exit_depth,
                        o.logprobs,
                        o.finish_reason,
                        o.num_cached_tokens,
                        o.prompt_logprobs,
                    )
                    for o in outs
                ]
                if self.role == "prefill":
                    for o in outs:
                        if o.request_id in self.outgoing:
                            self.outgoing[o.request_id].prompt_done = True
                for gen, error in self.engine.grammars.take_failed():
                    self._fail(gen, error)
            cache = self.cache_events()
            if tokens or self.changed or cache:  # the first token streams before its KV moves
                self.send(pr.Outputs(tokens, self.stats(), self.started, cache))
                self.started = []
            self.changed = False
            if self.role == "prefill":
                self._queue_chunks()
                self._prefill_progress()
            elif self.role == "decode":
                self._decode_progress()
            if self.changed or (cache := self.cache_events()):
                self.send(pr.Outputs([], self.stats(), cache=cache))
