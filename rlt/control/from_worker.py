"""Messages from a worker to the coordinator (msgspec tagged union)."""

import msgspec


class Hello(msgspec.Struct, tag="hello"):
    pid: int


class PeerInfo(msgspec.Struct, kw_only=True):
    """A worker's NIXL agent and registered KV pool, as its peers need them."""

    agent_name: str
    metadata: bytes
    base: int  # address of block 0
    num_blocks: int
    block_bytes: int
    mem_type: str  # "DRAM" | "VRAM"
    dev_id: int


class Ready(msgspec.Struct, tag="ready", kw_only=True):
    """Runtime results only: KV capacity, transport metadata, and the fingerprint of
    config + weights + dtype + KV layout."""

    kv_blocks_total: int
    block_size: int
    kv_planes: int  # block tables per request (core planes + boundary plane)
    fingerprint: str
    transport: PeerInfo | None = None  # prefill and decode roles


class Reserved(msgspec.Struct, tag="reserved"):
    """Decode worker: blocks reserved for a prompt being prefilled elsewhere (one table per plane:
    core planes, then the boundary plane)."""

    gen: int
    tables: list[list[int]]


class TransferDone(msgspec.Struct, tag="transfer_done"):
    """Prefill worker: every chunk of the prompt was written into the decode worker's blocks and
    the prefill worker's own blocks are free."""

    gen: int
    chunks: int
    bytes: int
    seconds: float


class Drained(msgspec.Struct, tag="drained"):
    """Prefill worker: a cancelled request has no write in flight any more and its blocks are free."""

    gen: int


class Stats(msgspec.Struct, array_like=True):
    running: int
    waiting: int
    kv_blocks_free: int


class Token(msgspec.Struct, array_like=True):
    gen: int
    token: int
    depth: int
    logprobs: dict[int, float] | None
    finish: str | None  # "stop" | "length" | None while running


class Outputs(msgspec.Struct, tag="outputs"):
    """Everything one worker step produced (one message per step, not per token), plus stats."""

    tokens: list[Token]
    stats: Stats
    started: list[int] = []  # prefill worker: generations it accepted since the last message


class Failed(msgspec.Struct, tag="failed"):
    """One request failed inside the worker; the worker keeps serving."""

    gen: int
    error: str


class Heartbeat(msgspec.Struct, tag="heartbeat"):
    """From the worker's heartbeat thread: alive, and whether its main loop is still moving."""

    pid: int
    progress: int  # main-loop iterations so far
    busy: bool  # the main loop has work


class Fatal(msgspec.Struct, tag="fatal"):
    """The worker is dying; its own error text."""

    error: str


FromWorker = Hello | Ready | Outputs | Failed | Heartbeat | Fatal | Reserved | TransferDone | Drained
encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(FromWorker)
