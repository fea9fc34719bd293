"""The seams a backend that spreads rlt's workers over hosts plugs into (rlt/dynamo), declared here
so that it needs nothing private of the coordinator. As vLLM's KV connector has a scheduler half and
a worker half:

- the decode side's remote prefill slot: `Engine.launch(..., remote_prefill=connector)`; the
  Supervisor asks the PrefillConnector for each prefill slot's worker (at start and at each
  restart) and gets a RemoteWorker: a prefill worker elsewhere, to the Supervisor and the Lifecycle
  a worker like a local process (credits, Ready, messages in order). It hands what the remote
  worker says back through the SlotHost it was given.
- the prefill side's relay: `Supervisor(..., events=sink)` runs the prefill worker process as in
  rlt's own PD topologies (spawn, handshake, fingerprint, heartbeats, restart) and hands each
  request's events to the EventSink in place of the Lifecycle.
"""

import asyncio
from typing import Protocol

from rlt.contract import protocol as pr
from rlt.contract.config import LaunchConfig
from rlt.control.worker_proc import Credits, PrefixIndex
from rlt.errors import EngineDeadError


class SlotHost(Protocol):
    """What a RemoteWorker may call on the Supervisor that owns its slot."""

    launch: LaunchConfig

    @property
    # config + weights + dtype + KV layout, as the workers hashed it
    def fingerprint(self) -> str | None: ...

    # one of the worker's messages (pr.FromWorker)
    async def dispatch(self, w: "RemoteWorker", msg) -> None: ...

    def writer_lost(self, w: "RemoteWorker", gen: int, error: str) -> None:
        """The request's writer can no longer be reached but may still write (until its transfer
        deadline, after which the worker's Drained is dispatched): the request fails now, its
        decode blocks stay held."""


class RemoteWorker:
    """A worker slot served elsewhere. Subclasses implement spawn (find it), wait_ready (its Ready)
    and send (one message, in order); closing it (kill) is its death to the Supervisor."""

    pid = None  # no local process: no heartbeat watch (its liveness is its own)

    def __init__(self, host: SlotHost, slot: int, index: int, role: str):
        self.host, self.slot, self.index, self.role = host, slot, index, role
        self.identity = f"remote-{role}{index}"
        self.ready: pr.Ready | None = None
        self.stats, self.credits, self.prefixes = pr.Stats(0, 0, 0), Credits(), PrefixIndex()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.sender: asyncio.Task | None = None  # the Supervisor's message pump
        self.last_seen = 0.0
        self._closed = asyncio.get_running_loop().create_future()

    async def spawn(self, handshake_timeout: float) -> None:
        raise NotImplementedError

    async def wait_ready(self, timeout: float) -> pr.Ready:
        raise NotImplementedError

    async def send(self, msg) -> bool:
        """False only once it is gone."""
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        return not self._closed.done()

    async def wait(self) -> int:
        return await asyncio.shield(self._closed)

    async def stop(self, graceful_s: float = 5.0) -> None:
        self.kill()

    def kill(self, because: str | None = None) -> None:
        if not self._closed.done():
            self._closed.set_result(0)

    def dead_error(self) -> EngineDeadError:
        return EngineDeadError(f"the remote {self.role} proxy was closed")


class PrefillConnector(Protocol):
    """The decode side's half: makes each prefill slot a RemoteWorker."""

    async def open(self, host: SlotHost, slot: int, index: int) -> RemoteWorker: ...


class EventSink(Protocol):
    """The prefill side's half: what the Supervisor hands a worker's request events to (the
    Lifecycle's interface; `w` is the worker that sent it)."""

    def on_started(self, gens: list[int]) -> None: ...

    def on_token(self, w, t: pr.Token) -> None: ...

    def on_reserved(self, w, msg: pr.Reserved) -> None: ...

    def on_prefill_released(self, w, gen: int, done: pr.TransferDone | None) -> None: ...

    def on_failed(self, w, msg: pr.Failed) -> None: ...

    def on_writer_lost(self, w, gen: int, error: str) -> None: ...

    def on_worker_dead(self, w, err: EngineDeadError) -> None: ...

    def tokens_of(self, gen: int) -> list[int] | None:
        """The request's tokens so far (prompt, then output), or None once it is gone."""

    def decode_worker(self, gen: int):
        """The worker the request's KV is written into, where it is local and alive, else None."""
