"""The coordinator <-> worker protocol: msgspec Structs in two tagged unions, one per direction.

Messages carry ids, token ids and small metadata, never tensors. A request is named on the wire by
its generation id (an int, fresh for every admission and never reused); the user's request id
stays in the coordinator.
"""

import msgspec

from rlt.contract.config import EngineConfig, LaunchConfig
from rlt.contract.sampling_params import ResolvedParams


# ---- coordinator -> worker -----------------------------------------------------------------------
class Handshake(msgspec.Struct, tag="handshake", kw_only=True):
    """The ModelConfig (as config.json after overrides: the worker rebuilds it without reading files),
    this worker's place, and the typed options."""

    model_path: str
    config: dict
    device: str
    role: str  # "unified" | "prefill" | "decode"
    engine: EngineConfig
    launch: LaunchConfig
    cache_events: bool = False  # report the prefix cache's inserts and evictions (Outputs.cache)


class Add(msgspec.Struct, tag="add", kw_only=True):
    gen: int
    prompt: list[int]
    params: ResolvedParams
    priority: int = 0


class Abort(msgspec.Struct, tag="abort"):
    """Drop these generations (running, waiting, or a decode worker's reservation) and free their
    blocks. For a reservation the coordinator sends it only once no write can still land."""

    gens: list[int]


class PeerInfo(msgspec.Struct, kw_only=True):
    """A worker's NIXL agent and registered KV pool, as its peers need them."""

    agent_name: str
    metadata: bytes
    base: int  # address of block 0
    num_blocks: int
    block_bytes: int
    mem_type: str  # "DRAM" | "VRAM"
    dev_id: int


class Connect(msgspec.Struct, tag="connect"):
    """Introduce peers (the decode workers a prefill worker writes to)."""

    peers: list[PeerInfo]


class Reserve(msgspec.Struct, tag="reserve"):
    """Decode worker: reserve blocks for a prompt of prompt_len tokens (and its first decode
    position); reply Reserved. The request's later positions take blocks as it decodes."""

    gen: int
    prompt_len: int
    max_tokens: int


class Prefill(msgspec.Struct, tag="prefill", kw_only=True):
    """Prefill worker: run the prompt at its max_loops, write each finished chunk into the decode
    worker's blocks, sample the first token."""

    gen: int
    prompt: list[int]
    params: ResolvedParams
    priority: int = 0
    dst_agent: str
    dst_tables: list[list[int]]
    # the generation the decode worker knows the request by, named in each chunk's notification
    # (None: gen — one coordinator numbers both; a Dynamo prefill node numbers its own)
    dst_gen: int | None = None


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


# ---- worker -> coordinator -----------------------------------------------------------------------
class Hello(msgspec.Struct, tag="hello"):
    pid: int


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
    preemptions: int = 0  # requests preempted (and later resumed by recompute) since READY
    captures_after_ready: int = 0  # CUDA graphs captured since READY (rlt/workers/counters.py)
    compiles_after_ready: int = 0  # Triton specializations built or loaded since READY
    prefix_queried_tokens: int = 0  # prompt tokens looked up in the prefix cache since READY
    prefix_hit_tokens: int = 0  # of those, the ones found cached
    prefix_cached_blocks: int = 0  # KV blocks holding cached prefixes now (in use or free to evict)
    # self-speculation since READY: rounds verified, draft tokens checked, accepted
    spec_rounds: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0


class Token(msgspec.Struct, array_like=True):
    gen: int
    token: int
    depth: int
    logprobs: dict[int, float] | None
    finish: str | None  # "stop" | "length" | None while running
    # a request's first token: its prompt positions found in the prefix cache
    num_cached_tokens: int | None = None
    # a request's first token, if asked: per prompt position, top-K and the prompt token {id:
    # logprob}
    # (the first None). Last: Token is array_like
    prompt_logprobs: list[dict[int, float] | None] | None = None


class CacheEvents(msgspec.Struct, array_like=True):
    """What changed in a worker's prefix cache since its last Outputs (when the Handshake asks): the
    blocks inserted, as (generation, logical block index, key id: the key's first 8 bytes as a
    signed int, rlt/contract/prefix_keys.py key_id), and the key ids evicted. Tokens travel only
    the other way: the coordinator has them."""

    stored: list[tuple[int, int, int]]
    removed: list[int]


class Outputs(msgspec.Struct, tag="outputs"):
    """Everything one worker step produced (one message per step, not per token), plus stats."""

    tokens: list[Token]
    stats: Stats
    started: list[int] = []  # prefill worker: generations it accepted since the last message
    cache: CacheEvents | None = None  # prefix-cache changes, when the Handshake asked for them


class Failed(msgspec.Struct, tag="failed"):
    """One request failed inside the worker; the worker keeps serving."""

    gen: int
    error: str


class Heartbeat(msgspec.Struct, tag="heartbeat"):
    """From the worker's heartbeat thread: alive, and whether its main loop is still moving."""

    pid: int
    progress: int  # main-loop iterations so far
    busy: bool  # the main loop has work
    trouble: str | None = None  # why it cannot serve though it beats (its grammar compiles stuck)


class Fatal(msgspec.Struct, tag="fatal"):
    """The worker is dying; its own error text."""

    error: str


FromWorker = (
    Hello | Ready | Outputs | Failed | Heartbeat | Fatal | Reserved | TransferDone | Drained
)

encoder = msgspec.msgpack.Encoder()
to_worker = msgspec.msgpack.Decoder(ToWorker)
from_worker = msgspec.msgpack.Decoder(FromWorker)
