"""A prefill node: one rlt prefill worker behind the Dynamo endpoint NAMESPACE.prefill.generate.

Decode nodes call it (rlt/dynamo/remote.py); it is no model of its own to the frontend. A Supervisor
runs the prefill worker process as in rlt's own PD topologies (spawn, handshake, fingerprint,
heartbeats, restart); in place of the Lifecycle, a Relay (rlt's EventSink: rlt/control/connector.py)
hands each request's events back on its caller's stream. A decode node's NIXL agent is introduced to
the worker (Connect) the first time one of its requests arrives, and again when its agent changes (a
restarted decode worker). Writer-before-reader holds across the network: a cancelled request's
stream ends only with Drained (or TransferDone), when the worker has nothing left in flight.
"""

import asyncio
import itertools

import msgspec

from rlt.contract import protocol as pr
from rlt.control.connector import EventSink
from rlt.control.supervisor import Supervisor
from rlt.dynamo import wire
from rlt.errors import EngineDeadError


class Relay(EventSink):
    """A prefill node's EventSink: events to per-request queues, with the caller's generation id."""

    def __init__(self):
        self.queues: dict[int, asyncio.Queue] = {}  # local generation -> its caller's queue
        self.remote_gen: dict[int, int] = {}

    def open(self, local: int, remote: int) -> asyncio.Queue:
        self.queues[local], self.remote_gen[local] = asyncio.Queue(), remote
        return self.queues[local]

    def close(self, local: int) -> None:
        self.queues.pop(local, None)
        self.remote_gen.pop(local, None)

    def _put(self, local: int, msg) -> None:
        if (q := self.queues.get(local)) is not None:
            q.put_nowait(msg)

    def on_started(self, gens: list[int]) -> None:
        for g in gens:
            if g in self.queues:
                self._put(g, pr.Outputs([], pr.Stats(0, 0, 0), started=[self.remote_gen[g]]))

    def on_token(self, w, t: pr.Token) -> None:
        if t.gen in self.queues:
            self._put(
                t.gen, pr.Outputs([msgspec.structs.replace(t, gen=self.remote_gen[t.gen])], w.stats)
            )

    def on_prefill_released(self, w, gen: int, done: pr.TransferDone | None) -> None:
        if gen in self.queues:
            r = self.remote_gen[gen]
            self._put(
                gen,
                pr.Drained(r)
                if done is None
                else pr.TransferDone(r, done.chunks, done.bytes, done.seconds),
            )

    def on_failed(self, w, msg: pr.Failed) -> None:
        if msg.gen in self.queues:
            self._put(msg.gen, pr.Failed(self.remote_gen[msg.gen], msg.error))

    def on_worker_dead(self, w, err: EngineDeadError) -> None:
        """A dead writer writes nothing more: every request it held ends, failed."""
        for g in list(self.queues):
            self._put(g, pr.Failed(self.remote_gen[g], str(err)))

    # (a prefill node has no decode worker, reserves nothing, holds no tokens and no remote writer)
    def on_reserved(self, w, msg: pr.Reserved) -> None:
        raise AssertionError("a prefill node reserves nothing")

    def on_writer_lost(self, w, gen: int, error: str) -> None:
        raise AssertionError("a prefill node's writer is its own worker")

    def tokens_of(self, gen: int) -> None:
        return None

    def decode_worker(self, gen: int) -> None:
        return None


class PrefillNode:
    def __init__(self, launch):
        """launch: rlt.Engine.launch(model, topology="1p1d", ...) — its checked configuration."""
        e = launch.engine
        self.relay = Relay()
        self.supervisor = Supervisor(
            e.model_config,
            e.engine_config,
            e.launch_config,
            slots=[("prefill", 0)],
            events=self.relay,
        )
        self._gens = itertools.count(1)
        self._keys: dict[str, int] = {}  # the caller's key -> local generation
        # decode agents introduced to the worker, their metadata
        self._agents: dict[str, bytes] = {}
        self.prefilled, self.kv_bytes = 0, 0  # prompts whose KV was handed off, and its bytes

    async def start(self) -> None:
        await self.supervisor.start()

    async def shutdown(self) -> None:
        await self.supervisor.shutdown()

    async def drain(self, timeout: float) -> int:
        """Wait (up to timeout) until no prefill is held: -> how many still are."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.relay.queues and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        return len(self.relay.queues)

    @property
    def worker(self):
        w = self.supervisor.workers[0]
        if w is None or w.ready is None:
            raise EngineDeadError(self.supervisor.dead_reason or "the prefill worker is not ready")
        return w

    async def handle(self, request: dict, context):
        """The endpoint's handler (rlt/dynamo/wire.py: its Calls and Replies)."""
        c = wire.call(request)
        if isinstance(c, wire.InfoCall):
            yield wire.pack(wire.InfoReply(self.worker.ready))
        elif isinstance(c, wire.CancelCall):
            local = self._keys.get(c.key)
            if local is not None and self.supervisor.workers[0] is not None:
                self.supervisor.post(self.supervisor.workers[0], pr.Cancel(local))
            yield wire.pack(wire.Cancelled(local is not None))
        else:
            async for item in self._prefill(c):
                yield wire.pack(wire.Event(item))

    async def _prefill(self, c: wire.PrefillCall):
        """The prefill worker's messages about the call's request."""
        p, peer, key = c.prefill, c.peer, c.key
        try:
            w = self.worker
        except EngineDeadError as e:
            yield pr.Failed(p.gen, str(e))
            return
        if c.fingerprint != w.ready.fingerprint:
            error = (
                f"the prefill worker's fingerprint {w.ready.fingerprint} differs from the decode worker's "
                f"{c.fingerprint}: config, weights, dtype or KV layout differ"
            )
            yield pr.Failed(p.gen, error)
            return
        if self._agents.get(peer.agent_name) != peer.metadata:
            self._agents[peer.agent_name] = peer.metadata
            self.supervisor.post(w, pr.Connect([peer]))
        local = next(self._gens)
        queue = self.relay.open(local, p.gen)
        self._keys[key] = local
        self.supervisor.post(
            w,
            pr.Prefill(
                gen=local,
                prompt=p.prompt,
                params=p.params,
                priority=p.priority,
                dst_agent=peer.agent_name,
                dst_tables=p.dst_tables,
                dst_gen=p.gen,
            ),
        )
        ended = False
        try:
            while not ended:
                msg = await queue.get()
                ended = isinstance(msg, (pr.TransferDone, pr.Drained, pr.Failed))
                if isinstance(msg, pr.TransferDone):
                    self.prefilled, self.kv_bytes = self.prefilled + 1, self.kv_bytes + msg.bytes
                yield msg
        finally:
            # the caller is gone: stop writing to it
            if not ended and self.supervisor.workers[0] is not None:
                self.supervisor.post(self.supervisor.workers[0], pr.Cancel(local))
            self.relay.close(local)
            self._keys.pop(key, None)
