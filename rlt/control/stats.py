"""Engine.stats(): the coordinator's view of its workers (state, KV, load, first-use work, prefix
cache) and of its requests (live, queued, handed off), as one dict."""


def engine_stats(sup, lc) -> dict:
    workers = []
    for w in sup.workers:
        if w is None:
            continue
        rd, s = w.ready, w.stats
        workers.append(
            {
                "role": w.role,
                "pid": w.pid,
                "state": "ready" if rd else "restarting" if w.slot in sup.restarting else "starting",
                "kv_blocks_total": rd.kv_blocks_total if rd else 0,
                "kv_planes": rd.kv_planes if rd else 1,  # physical blocks per logical block (one per plane)
                "kv_blocks_free": s.kv_blocks_free,
                "running": s.running,
                "preemptions": s.preemptions,
                "waiting": s.waiting,
                "credit_blocks": w.credits.blocks,
                "credit_slots": w.credits.slots,
                # first-use work after READY (each stalls the worker's passes): CUDA graphs, Triton
                "captures_after_ready": s.captures_after_ready,
                "compiles_after_ready": s.compiles_after_ready,
                # prefix cache: prompt tokens looked up and found since READY, blocks holding cached prefixes
                "prefix_queried_tokens": s.prefix_queried_tokens,
                "prefix_hit_tokens": s.prefix_hit_tokens,
                "prefix_cached_blocks": s.prefix_cached_blocks,
            }
        )
    queried = sum(w["prefix_queried_tokens"] for w in workers)
    return {
        "log_dir": sup.log_dir,
        "live_requests": len(lc.live),
        "queued_requests": lc.num_queued,  # waiting in the coordinator for a worker with room
        # slots whose worker died: restart attempt under way, and why the last one failed
        "restarting": {"{}{}".format(*sup.slots[slot]): attempt for slot, attempt in sup.restarting.items()},
        "last_error": sup.dead_reason,
        "pending_cleanup": len(lc.gens) - len(lc.live),
        "local_prefills": lc.local_prefills,
        "kv_chunks": lc.kv_chunks,
        "kv_bytes": lc.kv_bytes,  # PD: KV handed off, and the seconds from Prefill to written, summed
        "kv_seconds": lc.kv_seconds,
        # prompt tokens found in the prefix cache, of those looked up, since READY
        "prefix_cache_hit_rate": sum(w["prefix_hit_tokens"] for w in workers) / queried if queried else 0.0,
        "workers": workers,
    }
