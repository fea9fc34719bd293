"""Messages from the coordinator to a worker (msgspec tagged union; ids and small metadata only)."""

import msgspec

from rlt.control.from_worker import PeerInfo
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
    transfer_timeout: float = 30.0  # a KV write (or a decode worker's wait for one) past this fails the request


class Add(msgspec.Struct, tag="add", kw_only=True):
    gen: int  # internal generation id: fresh for every admission, never reused
    prompt: list[int]
    params: ResolvedParams
    priority: int = 0


class Abort(msgspec.Struct, tag="abort"):
    """Drop these generations (running, waiting, or a decode worker's reservation) and free their
    blocks. For a reservation the coordinator sends it only once no write can still land."""

    gens: list[int]


class Connect(msgspec.Struct, tag="connect"):
    """Introduce peers (the decode workers a prefill worker writes to)."""

    peers: list[PeerInfo]


class Reserve(msgspec.Struct, tag="reserve"):
    """Decode worker: reserve blocks for `positions` positions (prompt + max_tokens); reply Reserved."""

    gen: int
    positions: int


class Prefill(msgspec.Struct, tag="prefill", kw_only=True):
    """Prefill worker: run the prompt at full depth, write each finished chunk into the decode
    worker's blocks, sample the first token."""

    gen: int
    prompt: list[int]
    params: ResolvedParams
    priority: int = 0
    dst_agent: str
    dst_tables: list[list[int]]


class Cancel(msgspec.Struct, tag="cancel"):
    """Prefill worker: stop, wait for writes in flight, free the blocks; reply Drained."""

    gen: int


class Activate(msgspec.Struct, tag="activate", kw_only=True):
    """Decode worker: once all `chunks` notifications of gen arrived, decode from first_token."""

    gen: int
    prompt: list[int]
    params: ResolvedParams
    priority: int = 0
    first_token: int
    chunks: int


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


ToWorker = Handshake | Add | Abort | Shutdown | Connect | Reserve | Prefill | Cancel | Activate
encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(ToWorker)
