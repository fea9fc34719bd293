"""Messages from the coordinator to a worker (msgspec tagged union; ids and small metadata only)."""

import msgspec

from rlt.control.validation import ResolvedParams


class Handshake(msgspec.Struct, tag="handshake", kw_only=True):
    """The ModelConfig (as config.json after overrides: the worker rebuilds it without reading files)
    and the engine options."""

    model_path: str
    config: dict
    dtype: str | None
    device: str
    role: str
    engine: dict  # EngineConfig fields
    heartbeat_interval: float


class Add(msgspec.Struct, tag="add", kw_only=True):
    gen: int  # internal generation id: fresh for every admission, never reused
    prompt: list[int]
    params: ResolvedParams
    priority: int = 0


class Abort(msgspec.Struct, tag="abort"):
    gens: list[int]


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


ToWorker = Handshake | Add | Abort | Shutdown
encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(ToWorker)
