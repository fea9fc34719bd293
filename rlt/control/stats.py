"""Engine.stats(): the coordinator's view of its workers (state, KV, load, first-use work, prefix
cache) and of its requests (live, queued, handed off), as typed structs. Read their fields;
msgspec.to_builtins(engine.stats()) is the same as plain JSON-able dicts and lists."""

from typing import Literal

import msgspec


class PrefixCacheStats(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's prefix cache since READY (the engine's: summed over its workers)."""

    queried_tokens: int = 0  # prompt tokens looked up
    hit_tokens: int = 0  # of those, found
    # KV blocks holding cached prefixes (those no request uses count as free)
    cached_blocks: int = 0
    hit_rate: float = 0.0  # hit_tokens / queried_tokens (0 before any lookup)


def prefix_cache(queried: int, hit: int, cached: int) -> PrefixCacheStats:
    return PrefixCacheStats(
        queried_tokens=queried,
        hit_tokens=hit,
        cached_blocks=cached,
        hit_rate=hit / queried if queried else 0.0,
    )


class WorkerStats(msgspec.Struct, frozen=True, kw_only=True):
    role: str  # "unified", "prefill" or "decode"
    pid: int | None  # None: a prefill slot served elsewhere (a Dynamo decode node's)
    state: Literal["starting", "ready", "restarting"]
    kv_blocks_total: int  # physical blocks: kv_planes per logical block (0 before READY)
    kv_planes: int  # physical blocks per logical block (one per storage plane)
    kv_blocks_free: int
    running: int
    waiting: int
    preemptions: int
    credit_blocks: int  # blocks and requests the coordinator has assigned it, not yet released
    credit_slots: int
    # first-use work after READY (each stalls the worker's passes): CUDA graphs, Triton compiles
    captures_after_ready: int
    compiles_after_ready: int
    prefix_cache: PrefixCacheStats
    # self-speculation: rounds verified, draft tokens checked, those equal to their targets
    spec_rounds: int
    spec_draft_tokens: int
    spec_accepted_tokens: int


class EngineStats(msgspec.Struct, frozen=True, kw_only=True):
    log_dir: str | None  # the workers' logs, one directory per launch
    live_requests: int
    queued_requests: int  # waiting in the coordinator for a worker with room
    restarting: dict[str, int]  # slot ("unified0") whose worker died -> restart attempt under way
    last_error: str | None  # why the last worker died, or its last restart attempt failed
    pending_cleanup: int  # requests gone from the user's view whose resources are still returning
    local_prefills: int  # PD: prompts the decode worker prefilled itself
    # PD: KV writes handed off, their bytes, and the seconds from Prefill to written, summed
    kv_chunks: int
    kv_bytes: int
    kv_seconds: float
    prefix_cache: PrefixCacheStats  # summed over the workers
    workers: list[WorkerStats]


def worker_stats(w, restarting: bool) -> WorkerStats:
    rd, s = w.ready, w.stats
    return WorkerStats(
        role=w.role,
        pid=w.pid,
        state="ready" if rd else "restarting" if restarting else "starting",
        kv_blocks_total=rd.kv_blocks_total if rd else 0,
        kv_planes=rd.kv_planes if rd else 1,
        kv_blocks_free=s.kv_blocks_free,
        running=s.running,
        waiting=s.waiting,
        preemptions=s.preemptions,
        credit_blocks=w.credits.blocks,
        credit_slots=w.credits.slots,
        captures_after_ready=s.captures_after_ready,
        compiles_after_ready=s.compiles_after_ready,
        prefix_cache=prefix_cache(
            s.prefix_queried_tokens, s.prefix_hit_tokens, s.prefix_cached_blocks
        ),
        spec_rounds=s.spec_rounds,
        spec_draft_tokens=s.spec_draft_tokens,
        spec_accepted_tokens=s.spec_accepted_tokens,
    )


def engine_stats(sup, lc) -> EngineStats:
    workers = [worker_stats(w, w.slot in sup.restarting) for w in sup.workers if w is not None]
    caches = [w.prefix_cache for w in workers]
    queried, hit = sum(c.queried_tokens for c in caches), sum(c.hit_tokens for c in caches)
    return EngineStats(
        log_dir=sup.log_dir,
        live_requests=len(lc.live),
        queued_requests=lc.num_queued,
        restarting={
            "{}{}".format(*sup.slots[slot]): attempt for slot, attempt in sup.restarting.items()
        },
        last_error=sup.dead_reason,
        pending_cleanup=len(lc.gens) - len(lc.live),
        local_prefills=lc.local_prefills,
        kv_chunks=lc.kv_chunks,
        kv_bytes=lc.kv_bytes,
        kv_seconds=lc.kv_seconds,
        prefix_cache=prefix_cache(queried, hit, sum(c.cached_blocks for c in caches)),
        workers=workers,
    )
