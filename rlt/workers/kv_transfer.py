"""KV transport between workers: one NIXL agent (UCX) per worker over its whole KV pool.

The pool is registered once (DRAM on CPU, VRAM on GPU). A prefill worker WRITEs blocks of a
prompt into a decode worker's reserved blocks; each write carries a notification naming the
generation and sequence ("gen:seq"). Runs of consecutive blocks become one descriptor, so a
prompt moves in a few large transfers (one block of one plane is contiguous across layers).
Transfers are posted and polled from the worker's own loop: NIXL never runs on an asyncio loop.
"""

import time

import numpy as np
import torch

from rlt.contract.protocol import PeerInfo


class TransferError(RuntimeError):
    pass


def _runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
    """(src_start, dst_start, count) for maximal runs where both sides are consecutive."""
    runs: list[list[int]] = []
    for s, d in zip(src, dst):
        if runs and s == runs[-1][0] + runs[-1][2] and d == runs[-1][1] + runs[-1][2]:
            runs[-1][2] += 1
        else:
            runs.append([s, d, 1])
    return [tuple(r) for r in runs]


class KVTransport:
    def __init__(self, name: str, cache: torch.Tensor):
        from nixl._api import nixl_agent, nixl_agent_config

        # No progress thread: it halves throughput on small hosts; the worker loop progresses the
        # agent (transfer / check_xfer_state / get_new_notifs).
        self.agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        self.name = name
        self.cache = cache
        self.reg = self.agent.register_memory(cache)
        self.mem_type = "VRAM" if cache.is_cuda else "DRAM"
        self.dev_id = (cache.device.index or 0) if cache.is_cuda else 0
        self.block_bytes = cache[0].numel() * cache.element_size()
        self.peers: dict[str, PeerInfo] = {}

    def info(self) -> PeerInfo:
        return PeerInfo(
            agent_name=self.name,
            metadata=self.agent.get_agent_metadata(),
            base=self.cache.data_ptr(),
            num_blocks=self.cache.shape[0],
            block_bytes=self.block_bytes,
            mem_type=self.mem_type,
            dev_id=self.dev_id,
        )

    def add_peer(self, peer: PeerInfo) -> None:
        if peer.block_bytes != self.block_bytes:
            raise TransferError(
                f"peer {peer.agent_name} has {peer.block_bytes}-byte KV blocks, "
                f"this worker {self.block_bytes}: KV layouts differ"
            )
        old = self.peers.get(peer.agent_name)
        if old is not None and old.metadata != peer.metadata:
            self.agent.remove_remote_agent(peer.agent_name)
        self.agent.add_remote_agent(peer.metadata)
        self.peers[peer.agent_name] = peer

    def write(self, peer_name: str, src_blocks: list[int], dst_blocks: list[int], notif: bytes):
        """Post a WRITE of src_blocks (here) into dst_blocks (peer); returns the handle."""
        peer = self.peers.get(peer_name)
        if peer is None:
            raise TransferError(f"unknown peer {peer_name!r}")
        bb = self.block_bytes
        runs = _runs(src_blocks, dst_blocks)
        local = np.array(
            [(self.cache.data_ptr() + s * bb, n * bb, self.dev_id) for s, _, n in runs],
            dtype=np.uint64,
        )
        remote = np.array(
            [(peer.base + d * bb, n * bb, peer.dev_id) for _, d, n in runs], dtype=np.uint64
        )
        try:
            h = self.agent.initialize_xfer(
                "WRITE",
                self.agent.get_xfer_descs(local, self.mem_type),
                self.agent.get_xfer_descs(remote, peer.mem_type),
                peer_name,
                notif,
            )
            if self.agent.transfer(h) == "ERR":
                raise TransferError(f"KV write to {peer_name} failed to post")
        except TransferError:
            raise
        except Exception as e:  # nixl*Error: disconnects, bad descriptors
            raise TransferError(f"KV write to {peer_name} failed: {type(e).__name__}: {e}") from e
        return h

    def poll(self, handle) -> bool:
        """True when done; raises TransferError on failure."""
        try:
            state = self.agent.check_xfer_state(handle)
        except Exception as e:
            raise TransferError(f"KV write failed: {type(e).__name__}: {e}") from e
        if state == "ERR":
            raise TransferError("KV write failed (state ERR)")
        return state == "DONE"

    def release(self, handle) -> None:
        try:
            self.agent.release_xfer_handle(handle)
        except Exception:  # noqa: BLE001 - releasing a failed handle may raise; nothing to free then
            pass

    def notifications(self) -> list[tuple[int, int]]:
        """(gen, seq) of every notification received since the last call."""
        out = []
        for msgs in self.agent.get_new_notifs().values():
            for m in msgs:
                gen, _, seq = m.partition(b":")
                out.append((int(gen), int(seq)))
        return out

    def close(self) -> None:
        try:
            for name in list(self.peers):
                self.agent.remove_remote_agent(name)
            self.agent.deregister_memory(self.reg)
        except Exception:  # noqa: BLE001
            pass


def wait_done(transport: KVTransport, handle, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while not transport.poll(handle):
        if time.monotonic() > end:
            raise TransferError(f"KV write not done within {deadline_s} s")
