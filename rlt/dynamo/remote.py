"""A decode node's prefill slot: a proxy of the prefill nodes found through Dynamo (rlt's
PrefillConnector and RemoteWorker: rlt/control/connector.py).

To the decode node's Supervisor and Lifecycle it is a prefill worker like a local one (credits,
Ready, messages in order): rlt's request lifecycle — reserve on the decode worker, prefill and KV
writes on a prefill worker, the first token from it, activation on the decode worker,
writer-before-reader release — runs unchanged. What it is sent goes to a prefill node's endpoint
(rlt/dynamo/wire.py), round robin over the instances Dynamo's discovery lists, and what comes
back is handed to the Supervisor (its SlotHost) as that worker's own messages. A request's cancel goes to the
instance that took it; its blocks are freed when that instance reports nothing in flight, or, if
its stream breaks (the node died, or is cut off), once its transfer deadline has passed.
"""

import asyncio
import itertools

from rlt.contract import protocol as pr
from rlt.control.connector import RemoteWorker, SlotHost
from rlt.dynamo import wire


class DynamoPrefill:
    """The decode node's PrefillConnector: each prefill slot is a RemotePrefill over the Dynamo
    endpoint `endpoint` (a runtime of its own, made at the first open)."""

    def __init__(self, endpoint: str, runtime_args=()):
        self.endpoint, self.runtime_args, self.runtime = endpoint, runtime_args, None

    async def open(self, host: SlotHost, slot: int, index: int) -> "RemotePrefill":
        from dynamo.runtime import DistributedRuntime

        if self.runtime is None:
            self.runtime = DistributedRuntime(asyncio.get_running_loop(), *self.runtime_args)
        client = await self.runtime.endpoint(self.endpoint).client()
        return RemotePrefill(host, slot, index, client)

    def shutdown(self) -> None:
        if self.runtime is not None:
            self.runtime.shutdown()


class RemotePrefill(RemoteWorker):
    def __init__(self, host: SlotHost, slot: int, index: int, client):
        super().__init__(host, slot, index, "prefill")
        self.client = client
        self.peers: dict[str, pr.PeerInfo] = {}  # the decode workers' agents, by name
        self.taken: dict[int, tuple[int, str]] = {}  # generation -> (instance, key) that took it
        self._round = itertools.count()
        self._tasks: set[asyncio.Task] = set()

    async def spawn(self, handshake_timeout: float) -> None:
        try:
            await asyncio.wait_for(self.client.wait_for_instances(), handshake_timeout)
        except TimeoutError:
            raise TimeoutError(
                f"no rlt prefill node found through Dynamo within {handshake_timeout} s"
            ) from None

    async def wait_ready(self, timeout: float) -> pr.Ready:
        """The Ready of a prefill node (fingerprint, pool geometry): every node of a deployment runs
        the same checkpoint, which the decode node's Supervisor checks against its own."""
        stream = await self.client.round_robin(wire.pack(wire.InfoCall()), annotated=False)
        async for item in stream:
            self.ready = wire.reply(item).ready
        if self.ready is None:
            raise RuntimeError("a prefill node answered info without its Ready")
        return self.ready

    async def stop(self, graceful_s: float = 5.0) -> None:
        self.kill()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def send(self, msg) -> bool:
        if isinstance(msg, pr.Connect):
            self.peers |= {p.agent_name: p for p in msg.peers}
        elif isinstance(msg, pr.Prefill):
            self._spawn(self._prefill(msg))
        elif isinstance(msg, pr.Cancel):
            self._spawn(self._cancel(msg.gen))
        return True  # (Abort, Shutdown: a prefill node frees its side itself)

    # ---- requests --------------------------------------------------------------------------------
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
                call = wire.PrefillCall(
                    key=key,
                    prefill=msg,
                    peer=self.peers[msg.dst_agent],
                    fingerprint=self.host.fingerprint,
                )
                async for item in await self.client.direct(
                    wire.pack(call), instance, annotated=False
                ):
                    reply = wire.reply(item).msg
                    ended = isinstance(reply, (pr.TransferDone, pr.Drained, pr.Failed))
                    if isinstance(reply, pr.Outputs):
                        self.stats = reply.stats
                    await self.host.dispatch(self, reply)
                error = "the prefill node's stream ended early"
        except Exception as e:  # noqa: BLE001 - the request fails, the node keeps serving
            error = f"the prefill node's stream broke: {e}"
        finally:
            self.taken.pop(msg.gen, None)
        if not ended:  # it may still write (cut off, not dead) until its own transfer deadline
            self.host.writer_lost(self, msg.gen, error)
            if ids:  # (no node took it: nothing writes, its blocks are freed now)
                await asyncio.sleep(self.host.launch.transfer_timeout)
            await self.host.dispatch(self, pr.Drained(msg.gen))

    async def _cancel(self, gen: int) -> None:
        instance, key = self.taken.get(gen, (None, None))
        if instance is None:
            # it ended meanwhile (its own TransferDone / Drained / Failed frees the decode side)
            return
        try:
            async for _ in await self.client.direct(
                wire.pack(wire.CancelCall(key)), instance, annotated=False
            ):
                pass
        except Exception:  # noqa: BLE001 - the node is gone: its stream breaks and fails the request
            pass
