"""Fault injection for tests (LaunchConfig.faults): wrappers around a worker and its KV transport,
installed by worker_main only when faults are asked for, so no product path checks for them."""

import hashlib
import time

from rlt.contract import protocol as pr
from rlt.contract.config import Faults
from rlt.workers.kv_transfer import TransferError
from rlt.workers.worker import Worker


class _FaultyTransport:
    """The worker's KVTransport, failing, hanging, slowing or losing the notifications of chosen
    prompts' writes (a prompt known by the generation its notifications name)."""

    def __init__(self, transport, faults: Faults, first_tokens: dict[int, int]):
        self._transport, self._faults, self._first_tokens = transport, faults, first_tokens
        self._hung: set[int] = set()  # ids of write handles that never report done
        self._slow: dict[int, float] = {}  # ids of write handles -> when they may report done

    def __getattr__(self, name):
        return getattr(self._transport, name)

    def write(self, peer_name: str, src_blocks: list[int], dst_blocks: list[int], notif: bytes):
        first = self._first_tokens.get(int(notif.partition(b":")[0]))
        if first is not None and first == self._faults.fail_transfer_first_token:
            raise TransferError(f"injected transfer fault (prompt starts with token {first})")
        if first is not None and first == self._faults.lose_notif_first_token:
            notif = b"0:0"  # generation 0 is never issued: the decode worker drops it
        handle = self._transport.write(peer_name, src_blocks, dst_blocks, notif)
        if first is not None and first == self._faults.hang_transfer_first_token:
            self._hung.add(id(handle))
        if first is not None and first == self._faults.slow_transfer_first_token:
            self._slow[id(handle)] = time.monotonic() + self._faults.slow_transfer_seconds
        return handle

    def poll(self, handle) -> bool:
        if id(handle) in self._hung or time.monotonic() < self._slow.get(id(handle), 0.0):
            return False
        return self._transport.poll(handle)

    def release(self, handle) -> None:
        self._hung.discard(id(handle))
        self._slow.pop(id(handle), None)
        self._transport.release(handle)


class _FaultyWorker(Worker):
    def __init__(self, worker: Worker, faults: Faults):
        self.__dict__.update(worker.__dict__)
        self._faults, self._first_tokens = faults, {}
        side = self.side  # (the role's part writes and polls the transport)
        if side.transport is not None:
            side.transport = _FaultyTransport(side.transport, faults, self._first_tokens)

    def handle(self, msg) -> bool:
        if isinstance(msg, (pr.Add, pr.Prefill)):
            if msg.prompt[0] == self._faults.stall_first_token:
                self.counters.busy = True
                # a stuck kernel: the heartbeat thread keeps beating, the main loop does not
                while True:
                    time.sleep(1)
            # (keyed by the generation its KV writes' notifications name: a remote caller's own)
            dst = (
                msg.dst_gen if isinstance(msg, pr.Prefill) and msg.dst_gen is not None else msg.gen
            )
            self._first_tokens[dst] = msg.prompt[0]
        return super().handle(msg)


def inject(faults: Faults, worker: Worker, fingerprint: str) -> tuple[Worker, str]:
    """The worker (wrapped) and its fingerprint (salted for workers of faults.fingerprint_role)."""
    if faults.fingerprint_role == worker.role:
        fingerprint = hashlib.sha256(f"{fingerprint} injected fault".encode()).hexdigest()[:16]
    return _FaultyWorker(worker, faults), fingerprint
