"""Messages from a worker to the coordinator (msgspec tagged union)."""

import msgspec


class Hello(msgspec.Struct, tag="hello"):
    pid: int


class Ready(msgspec.Struct, tag="ready", kw_only=True):
    """Runtime results only: KV capacity and the fingerprint of config + weights + dtype + KV layout."""

    kv_blocks_total: int
    block_size: int
    kv_planes: int  # block tables per request (core planes + boundary plane)
    fingerprint: str


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


class Failed(msgspec.Struct, tag="failed"):
    """One request failed inside the worker; the worker keeps serving."""

    gen: int
    error: str


class Heartbeat(msgspec.Struct, tag="heartbeat"):
    pid: int


class Fatal(msgspec.Struct, tag="fatal"):
    """The worker is dying; its own error text."""

    error: str


FromWorker = Hello | Ready | Outputs | Failed | Heartbeat | Fatal
encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(FromWorker)
