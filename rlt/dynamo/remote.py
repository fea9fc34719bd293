"""A decode node's prefill slot: a proxy of the prefill nodes found through Dynamo.

To the decode node's Supervisor and Lifecycle it is a prefill worker like a local one (credits,
Ready, messages in order): rlt's request lifecycle — reserve on the decode worker, prefill and KV
writes on a prefill worker, the first token from it, activation on the decode worker,
writer-before-reader release — runs unchanged. What it is sent goes to a prefill node's endpoint
(rlt/dynamo/wire.py), round robin over the instances Dynamo's discovery lists, and what comes
back is handed to the Supervisor as that worker's own messages. A request's cancel goes to the
instance that took it; its blocks are freed when that instance reports nothing in flight, or, if
its stream breaks (the node died, or is cut off), once its transfer deadline has passed.
"""

import asyncio
import itertools

from rlt import protocol as pr
from rlt.control.worker_proc import Credits
from rlt.dynamo import wire
from rlt.errors import EngineDeadError


class RemotePrefill:
    def __init__(self, supervisor, slot: int, index: int, client):
        self.supervisor, self.slot, self.index, self.client = supervisor, slot, index, client
        self.role, self.identity, self.pid = "prefill", f"remote-prefill{index}", None
        self.ready: pr.Ready | None = None
        self.stats, self.credits = pr.Stats(0, 0, 0), Credits()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.sender = None  # (the Supervisor's: its message pump, and last_seen, are set at start)
        self.peers: dict[str, pr.PeerInfo] = {}  # the decode workers' agents, by name
        self.taken: dict[int, tuple[int, str]] = {}  # generation -> (instance, key) that took it
        self._round = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._closed = asyncio.get_running_loop().create_future()

    # ---- the WorkerProc interface the Supervisor uses --------------------------------------------
    @property
    def alive(self) -> bool:
        return not self._closed.done()

    async def spawn(self, handshake_timeout: float) -> None:
        try:
            await asyncio.wait_for(self.client.wait_for_instances(), handshake_timeout)
        except TimeoutError:
            raise TimeoutError(f"no rlt prefill node found through Dynamo within {handshake_timeout} s") from None

    async def wait_ready(self, timeout: float) -> pr.Ready:
        """The Ready of a prefill node (fingerprint, pool geometry): every node of a deployment runs
        the same checkpoint, which the decode node's Supervisor checks against its own."""
        stream = await self.client.round_robin({"op": "info"}, annotated=False)
        async for item in stream:
            self.ready = wire.unpack(item["ready"], wire.READY)
        if self.ready is None:
            raise RuntimeError("a prefill node answered info without its Ready")
        return self.ready

    async def wait(self) -> int:
        return await asyncio.shield(self._closed)

    async def stop(self, graceful_s: float = 5.0) -> None:
        self.kill()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def kill(self, because: str | None = None) -> None:
        if not self._closed.done():
            self._closed.set_result(0)

    def dead_error(self) -> EngineDeadError:
        return EngineDeadError("the remote prefill proxy was closed")

    async def send(self, msg) -> bool:
        if isinstance(msg, pr.Connect):
            self.peers |= {p.agent_name: p for p in msg.peers}
        elif isinstance(msg, pr.Prefill):
            self._spawn(self._prefill(msg))
        elif isinstance(msg, pr.Cancel):
            self._spawn(self._cancel(msg.gen))
        return True  # (Abort, Shutdown: a prefill node frees its side itself)

    # ---- requests ---------------------------------------------------------------------------------
    def _spawn(self, coro) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _prefill(self, msg: pr.Prefill) -> None:
        ended, error = False, "no rlt prefill node is serving"
        ids = self.client.instance_ids()
        try:
            if ids:
                instance = ids[next(self._round) % len(ids)]
                key = f"{msg.dst_agent}:{msg.gen}"
                self.taken[msg.gen] = (instance, key)
                request = {
                    "op": "prefill",
                    "key": key,
                    "prefill": wire.pack(msg),
                    "peer": wire.pack(self.peers[msg.dst_agent]),
                    "fingerprint": self.supervisor.fingerprint,
                }
                async for item in await self.client.direct(request, instance, annotated=False):
                    reply = wire.unpack(item["msg"], pr.from_worker)
                    ended = isinstance(reply, (pr.TransferDone, pr.Drained, pr.Failed))
                    if isinstance(reply, pr.Outputs):
                        self.stats = reply.stats
                    await self.supervisor.dispatch(self, reply)
                error = "the prefill node's stream ended early"
        except Exception as e:  # noqa: BLE001 - the request fails, the node keeps serving
            error = f"the prefill node's stream broke: {e}"
        finally:
            self.taken.pop(msg.gen, None)
        if not ended:  # it may still write (cut off, not dead) until its own transfer deadline
            self.supervisor.lifecycle.on_writer_lost(self, msg.gen, error)
            await asyncio.sleep(self.supervisor.launch.transfer_timeout)
            await self.supervisor.dispatch(self, pr.Drained(msg.gen))

    async def _cancel(self, gen: int) -> None:
        instance, key = self.taken.get(gen, (None, None))
        if instance is None:
            return  # it ended meanwhile (its own TransferDone / Drained / Failed frees the decode side)
        try:
            async for _ in await self.client.direct({"op": "cancel", "key": key}, instance, annotated=False):
                pass
        except Exception:  # noqa: BLE001 - the node is gone: its stream breaks and fails the request
            pass
