"""The prefill role's part: a Prefill runs a prompt (prefill only: its first token streams at once)
and writes its KV into a decode worker's reserved blocks over the KV transport, chunk by chunk as
the passes finish it, each write announced by a "gen:seq" notification; TransferDone once every
write is done, or Failed. A Cancel (or a failure) retires the prompt: its reply (Drained, Failed)
goes out only once none of its writes can still land."""

import time
from dataclasses import dataclass, field

from rlt.contract import protocol as pr
from rlt.errors import RequestError
from rlt.workers.kv_transfer import TransferError
from rlt.workers.roles.side import Side


@dataclass
class _Outgoing:
    """One prompt being written into a decode worker's blocks."""

    dst_agent: str
    dst_tables: list[list[int]]
    dst_gen: int  # the generation the decode worker knows it by (its notifications name it)
    seq: int = 0
    pending: list = field(default_factory=list)  # (handle, posted_at)
    prompt_done: bool = False
    bytes: int = 0
    started: float = field(default_factory=time.monotonic)


class PrefillSide(Side):
    def __init__(self, engine, outbox, transport, transfer_timeout: float):
        super().__init__(engine, outbox, transport, transfer_timeout)
        self.outgoing: dict[int, _Outgoing] = {}
        # retired prompts: writes still in flight, the replies to send after them
        self.draining: dict[int, tuple[_Outgoing, list]] = {}
        # Each step's chunk events with a device event recorded after its pass; a write is posted
        # once its pass is done (NIXL copies outside the compute stream).
        self.unposted: list[tuple[object | None, list]] = []

    def handle(self, msg) -> None:
        if isinstance(msg, pr.Prefill):
            try:
                request = (msg.gen, msg.prompt, msg.params, msg.priority)
                self.engine.add_request(*request, prefill_only=True)
                dst_gen = msg.gen if msg.dst_gen is None else msg.dst_gen
                self.outgoing[msg.gen] = _Outgoing(msg.dst_agent, msg.dst_tables, dst_gen)
                self.outbox.started.append(msg.gen)
            except RequestError as err:
                self.outbox.fail(msg.gen, str(err))
        elif isinstance(msg, pr.Cancel):
            self.retire(msg.gen, pr.Drained(msg.gen))
        else:
            super().handle(msg)

    def busy(self) -> bool:
        return bool(self.outgoing or self.draining)

    def stepped(self, outs: list) -> None:
        for o in outs:  # a prompt's output: its last chunk has run
            if o.request_id in self.outgoing:
                self.outgoing[o.request_id].prompt_done = True

    def fail(self, gen: int, error: str) -> None:
        self.retire(gen, pr.Failed(gen, error))

    def progress(self) -> None:
        self._queue_chunks()
        self._poll_writes()

    def retire(self, gen: int, reply) -> None:
        """Stop a generation and send `reply` (Drained, Failed) once none of its writes can still
        land: done, failed or past the deadline. The decode worker frees their destination only
        after that reply; the loop never waits for it (_poll_writes polls). Its source blocks are
        freed at once: a write still reading them lands only in its own reservation."""
        self.engine.abort(gen)
        o = self.outgoing.pop(gen, None)
        if gen in self.draining:
            self.draining[gen][1].append(reply)
        elif o is not None and o.pending:
            self.draining[gen] = (o, [reply])
        else:
            self.outbox.send(reply)
        self.outbox.changed = True

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
                self.fail(gen, str(err))
                continue
            o.pending.append((h, time.monotonic()))
            o.seq += 1
            o.bytes += len(src) * self.transport.block_bytes

    def _poll_writes(self) -> None:
        """Reply for retired prompts whose writes ended; TransferDone for prompts fully written;
        fail a prompt whose write failed or ran past its deadline."""
        now = time.monotonic()
        for gen, (o, replies) in list(self.draining.items()):
            o.pending = [(h, t) for h, t in o.pending if not self._ended(h, now - t)]
            if not o.pending:
                del self.draining[gen]
                for reply in replies:
                    self.outbox.send(reply)
                self.outbox.changed = True
        for gen, o in list(self.outgoing.items()):
            try:
                still = []
                for h, posted in o.pending:
                    if self.transport.poll(h):
                        self.transport.release(h)
                    elif now - posted > self.transfer_timeout:
                        late = f"KV write past its deadline ({self.transfer_timeout} s)"
                        raise TransferError(late)
                    else:
                        still.append((h, posted))
                o.pending = still
            except TransferError as err:
                self.fail(gen, str(err))
                continue
            if o.prompt_done and not o.pending and not self._awaits_device(gen):
                del self.outgoing[gen]
                self.engine.release_held(gen)
                self.outbox.send(pr.TransferDone(gen, o.seq, o.bytes, time.monotonic() - o.started))
                self.outbox.changed = True

    def _ended(self, handle, age: float) -> bool:
        """A retired generation's write: done, failed or past its deadline (then released)."""
        try:
            ended = self.transport.poll(handle) or age > self.transfer_timeout
        except TransferError:
            ended = True
        if ended:
            self.transport.release(handle)
        return ended
