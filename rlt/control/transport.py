"""The coordinator's end of the ZeroMQ transport: one ROUTER socket on ipc://, a DEALER per worker
(and one for its heartbeats). ROUTER_MANDATORY: an unroutable send raises, never drops silently.

No message is dropped. A worker's pipe holds 1,000 messages; when it is full the send raises
EAGAIN, and waiting for POLLOUT says nothing (the ROUTER is writable while any peer's pipe has
room, the worker's heartbeat socket among them), so the message is kept and retried every 1-20 ms:
backpressure. A worker is gone only when liveness says so (its exit, a silent heartbeat), never
because a send failed."""

import asyncio
import shutil
import tempfile

import zmq
import zmq.asyncio

from rlt.contract import protocol as pr

SEND_RETRY_S, SEND_RETRY_MAX_S = 0.001, 0.02  # a full worker queue is retried at these intervals


class Transport:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="rlt-")  # the control socket (removed by close)
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.addr = f"ipc://{self.dir}/control"
        self._sock.bind(self.addr)

    async def send(self, w, msg) -> bool:
        """Send to worker `w`, waiting while its queue is full. False only once `w` is not alive."""
        frames, delay = [w.identity.encode(), pr.encoder.encode(msg)], SEND_RETRY_S
        while True:
            try:
                await self._sock.send_multipart(frames, flags=zmq.NOBLOCK)
                return True
            # EAGAIN: its pipe is full; EHOSTUNREACH: not connected (yet, or any more)
            except zmq.ZMQError:
                if not w.alive:
                    return False
            await asyncio.sleep(delay)
            delay = min(2 * delay, SEND_RETRY_MAX_S)

    async def recv(self) -> tuple[str, object]:
        """(the sender's identity, its message)"""
        identity, payload = await self._sock.recv_multipart()
        return identity.decode(), pr.from_worker.decode(payload)

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()
        shutil.rmtree(self.dir, ignore_errors=True)
