"""The worker processes: spawn and handshake, messages to and from them (rlt/control/transport.py),
liveness and restart (rlt/control/liveness.py). Request events go to the Lifecycle (or a backend's
EventSink: rlt/control/connector.py).

Messages to one worker go through its outbox, so they keep their order (Reserve before Abort,
Prefill before Cancel) without the caller waiting. The receive loop never waits on a send (a worker
blocked sending its outputs would never read, and the two would wait on each other).
"""

import asyncio
import itertools
import logging
import time

from rlt.contract import protocol as pr
from rlt.contract.config import EngineConfig, LaunchConfig, parse_topology
from rlt.control.connector import EventSink, PrefillConnector, RemoteWorker
from rlt.control.devices import check_devices, device_for
from rlt.control.lifecycle import Lifecycle
from rlt.control.liveness import Liveness
from rlt.control.log_dir import new_run_dir
from rlt.control.transport import Transport
from rlt.control.worker_proc import WorkerProc
from rlt.models.model_config import ModelConfig

log = logging.getLogger("rlt")
PEER_DEATH_GRACE_S = 1.0  # how long a prefill worker's failure waits for its decode peer's death
# how long shutdown waits to hand a worker its last messages before killing it
SHUTDOWN_SEND_S = 2.0


class Supervisor(Liveness):
    """slots: the workers to run (default: the topology's). events: what request events go to
    (default: a Lifecycle of its own). remote_prefill: makes each prefill slot a RemoteWorker (a
    proxy of prefill workers elsewhere) instead of a local process (rlt/control/connector.py)."""

    def __init__(
        self,
        mc: ModelConfig,
        engine: EngineConfig,
        launch: LaunchConfig,
        slots=None,
        *,
        events: EventSink | None = None,
        remote_prefill: PrefillConnector | None = None,
    ):
        self.mc, self.engine, self.launch = mc, engine, launch
        self.slots = slots if slots is not None else parse_topology(launch.topology)
        self.remote_prefill = remote_prefill
        # set before start to have workers report their prefix caches (CacheRelay)
        self.cache_relay = None
        self.workers: list[WorkerProc | RemoteWorker | None] = [None] * len(self.slots)
        self.lifecycle = events if events is not None else Lifecycle(self.post)
        self.closing = False
        self.dead_reason: str | None = None  # why no worker of some role is ready, while restarting
        # set once a role the topology needs has no worker and none restarting
        self.gave_up = asyncio.Event()
        # called when a worker is back (or given up on): queued requests
        self.on_worker_ready = lambda: None
        self.restarting: dict[int, int] = {}  # slot -> restart attempt under way
        self._by_identity: dict[str, WorkerProc] = {}
        self._incarnations = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._fingerprint: str | None = None
        self._transport: Transport | None = None
        self.log_dir: str | None = None

    @property
    def fingerprint(self) -> str | None:
        """config + weights + dtype + KV layout, as every worker hashed it (None before start)."""
        return self._fingerprint

    def ready(self, role: str) -> list[WorkerProc]:
        return [w for w in self.workers if w is not None and w.role == role and w.ready is not None]

    @property
    def local_slots(self) -> list[tuple[str, int]]:
        """The slots (role, index) run here (a remote prefill slot takes no device; its liveness is its
        proxy's)."""
        return [
            (role, i) for role, i in self.slots if role != "prefill" or self.remote_prefill is None
        ]

    # ---- start / stop ----------------------------------------------------------------------------
    async def start(self) -> None:
        await check_devices(self.launch.device, self.launch.topology, len(self.local_slots))
        self._transport = Transport()
        self.log_dir = new_run_dir(self.launch.log_dir)  # the workers' logs (kept)
        self._spawn(self._recv_loop())
        self._spawn(self._heartbeat_watch())
        try:
            await asyncio.gather(*(self._start_worker(i) for i in range(len(self.slots))))
            self._check_fingerprints()
            await self._introduce_peers(None)
        except BaseException:
            await self.shutdown()
            raise

    async def _start_worker(self, slot: int) -> WorkerProc:
        role, index = self.slots[slot]
        if role == "prefill" and self.remote_prefill is not None:
            w = await self.remote_prefill.open(self, slot, index)
        else:
            w = WorkerProc(
                slot,
                index,
                role,
                device_for(self.launch.device, slot, len(self.slots), len(self.local_slots)),
                next(self._incarnations),
                self._transport.addr,
                self.log_dir,
            )
            self._by_identity[w.identity] = w
        self.workers[slot] = w
        await w.spawn(handshake_timeout=self.launch.startup_timeout)
        ready = await w.wait_ready(self.launch.startup_timeout)
        if self._fingerprint is not None and ready.fingerprint != self._fingerprint:  # a restart
            w.kill()
            raise RuntimeError(
                f"restarted {role} worker {index} has fingerprint {ready.fingerprint}, the others "
                f"{self._fingerprint}: config, weights, dtype or KV layout differ"
            )
        w.last_seen = time.monotonic()
        self._spawn(self._watch_exit(w))
        w.sender = self._spawn(self._sender(w))
        return w

    def _check_fingerprints(self) -> None:
        """Every worker must hash config + weights + dtype + KV layout identically; name who differs
        from the most common fingerprint (ties: the first worker's)."""
        fps = [w.ready.fingerprint for w in self.workers]
        ref = max(fps, key=lambda f: (fps.count(f), -fps.index(f)))
        odd = [w for w in self.workers if w.ready.fingerprint != ref]
        if odd:
            first = next(w for w in self.workers if w.ready.fingerprint == ref)
            names = ", ".join(
                f"{w.role} worker {w.index} (fingerprint {w.ready.fingerprint})" for w in odd
            )
            raise RuntimeError(
                f"{names} differs from {first.role} worker {first.index} (fingerprint {ref}): "
                "config, weights, dtype or KV layout differ"
            )
        self._fingerprint = ref

    async def _introduce_peers(self, new: WorkerProc | None) -> None:
        """Prefill workers learn the decode workers' agents (all of them, or the one restarted)."""
        decodes = self.ready("decode")
        for w in self.ready("prefill"):
            peers = decodes if new is None or new is w else [new] if new.role == "decode" else []
            if peers:
                await self._send(w, pr.Connect([d.ready.transport for d in peers]))

    async def shutdown(self) -> None:
        """Stop every worker, close the socket. Idempotent."""
        if self.closing:
            return
        self.closing = True

        async def last_words(w: WorkerProc) -> None:
            while not w.outbox.empty():  # what is queued (aborts) goes first
                await self._send(w, w.outbox.get_nowait())
            await self._send(w, pr.Shutdown())

        for w in self.workers:
            if w is not None and w.alive:
                try:
                    await asyncio.wait_for(last_words(w), SHUTDOWN_SEND_S)
                except TimeoutError:  # it reads nothing: it is killed
                    w.kill()
        await asyncio.gather(*(w.stop() for w in self.workers if w is not None))
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._transport is not None:  # (None: start() stopped at its device check)
            self._transport.close()

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    def writer_lost(self, w: RemoteWorker, gen: int, error: str) -> None:
        """A RemoteWorker lost a request's stream (rlt/control/connector.py SlotHost)."""
        self.lifecycle.on_writer_lost(w, gen, error)

    # ---- transport -------------------------------------------------------------------------------
    async def _send(self, w: WorkerProc, msg) -> bool:
        """Send, waiting while the worker's queue is full; False only once the worker is gone (its
        death handler reports it)."""
        if isinstance(w, RemoteWorker):
            return await w.send(msg)
        return await self._transport.send(w, msg)

    def post(self, w: WorkerProc, msg) -> None:
        """Queue a message for a live worker without waiting."""
        if w.alive:
            w.outbox.put_nowait(msg)

    async def _sender(self, w: WorkerProc) -> None:
        while True:
            msg = await w.outbox.get()
            try:
                await self._send(w, msg)
            except Exception as e:  # noqa: BLE001 - one request's message must not stop the sender
                log.exception("could not send %s to %s", type(msg).__name__, w.identity)
                if (gen := getattr(msg, "gen", None)) is not None:
                    self.lifecycle.on_failed(
                        w, pr.Failed(gen, f"could not send to the worker: {e!r}")
                    )

    async def _recv_loop(self) -> None:
        while True:
            identity, msg = await self._transport.recv()
            w = self._by_identity.get(identity.split("/")[0])
            if w is None:
                continue  # an earlier incarnation: drop
            w.last_seen = time.monotonic()
            await self.dispatch(w, msg)

    async def dispatch(self, w: WorkerProc | RemoteWorker, msg) -> None:
        """A message from a worker (or a RemoteWorker) into the lifecycle."""
        try:
            await self._dispatch(w, msg)
        except Exception as e:  # noqa: BLE001 - one bad message must not stop the receiver
            log.exception("dropped a message from %s: %s", w.identity, e)

    async def _dispatch(self, w: WorkerProc, msg) -> None:
        lc = self.lifecycle
        if isinstance(msg, pr.Outputs):
            w.stats = msg.stats
            # (before the tokens: a finish retires)
            if msg.cache is not None and self.cache_relay is not None:
                self.cache_relay.on_events(
                    "{}{}".format(*self.slots[w.slot]), msg.cache, lc.tokens_of
                )
            lc.on_started(msg.started)
            for t in msg.tokens:
                lc.on_token(w, t)
        elif isinstance(msg, pr.Reserved):
            lc.on_reserved(w, msg)
        elif isinstance(msg, pr.TransferDone):
            lc.on_prefill_released(w, msg.gen, msg)
        elif isinstance(msg, pr.Drained):
            lc.on_prefill_released(w, msg.gen, None)
        elif isinstance(msg, pr.Failed):
            if w.role == "prefill":
                self._spawn(self._prefill_failed(w, msg))
            else:
                lc.on_failed(w, msg)
        elif isinstance(msg, pr.Heartbeat):
            if msg.progress != w.progress or not msg.busy:
                w.progress, w.progress_at = msg.progress, time.monotonic()
            w.busy, w.trouble = msg.busy, msg.trouble
        elif isinstance(msg, pr.Hello):
            await self._send(
                w,
                pr.Handshake(
                    model_path=self.mc.path,
                    config=self.mc.raw,
                    device=w.device,
                    role=w.role,
                    engine=self.launch.engine_for(w.role, self.engine),
                    launch=self.launch,
                    cache_events=self.cache_relay is not None,
                ),
            )
        elif isinstance(msg, pr.Ready):
            w.ready, w.stats = msg, pr.Stats(0, 0, msg.kv_blocks_total)
            if not w.ready_future.done():
                w.ready_future.set_result(msg)
        elif isinstance(msg, pr.Fatal):
            w.fatal = msg.error

    async def _prefill_failed(self, w: WorkerProc, msg: pr.Failed) -> None:
        """A prefill worker's KV write can fail because its decode peer is dying (the peer's memory
        goes before the coordinator sees the exit): give that death, which carries the real cause,
        a moment to arrive; Lifecycle.on_failed then leaves the request to on_worker_dead."""
        d = self.lifecycle.decode_worker(msg.gen)
        if d is not None:
            try:
                await asyncio.wait_for(d.wait(), PEER_DEATH_GRACE_S)
            except TimeoutError:
                pass
        self.lifecycle.on_failed(w, msg)
