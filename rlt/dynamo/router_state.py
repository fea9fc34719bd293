"""What a Dynamo node tells Dynamo's KV-aware router and its operators, as Dynamo's vLLM and SGLang
backends do: KV events, load, health, metrics.

- KV events: the blocks of the node's rlt worker that a request with the default loop options would
  hit (rlt/control/cache_events.py), as Dynamo's stored/removed events through the KvEventPublisher
  the Dynamo worker hands the engine (a PushSource): block ids are rlt's keys (their first 8 bytes),
  the tokens go with them, and the router hashes them in its own blocks of the node's block size.
- Load: a ComponentSnapshot (KV blocks in use and total, in blocks of block_size positions on every
  plane, and the prefix-cache hit rate) pushed to Dynamo's SnapshotPublisher every LOAD_PERIOD_S
  and whenever it changes: the router's load signal and the dynamo_component_* gauges.
- Health: while the node's rlt worker cannot serve (dead, restarting: rlt.Engine.check_health),
  its endpoint leaves discovery, so the frontend routes elsewhere, and the canary fails; it comes
  back once the worker is READY again.
- Metrics: rlt's own `rlt:` metrics (rlt/frontends/metrics.py: exit depth, KV handoff, prefix cache,
  requests running and waiting) in Dynamo's /metrics, with the labels Dynamo adds to each node's.
"""

import asyncio
import logging

from dynamo.common.backend.health_check import build_health_check_payload
from dynamo.common.backend.metrics import register_engine_registry
from dynamo.common.backend.publisher import ComponentSnapshot, PushSource

from rlt.control.cache_events import StoredBlock
from rlt.control.stats import EngineStats
from rlt.errors import EngineDeadError

log = logging.getLogger("rlt.dynamo")
LOAD_PERIOD_S = 0.25  # how often the load snapshot is checked for a change (and health polled)


class KvEvents:
    """rlt's CacheListener for one worker, publishing through Dynamo's KvEventPublisher."""

    def __init__(self):
        self.publisher = None  # Dynamo's, once the worker hands it over (PushSource.on_ready)
        self.stored_blocks = self.removed_blocks = 0

    def attach(self, publisher) -> None:
        self.publisher = publisher

    def stored(self, worker: str, blocks: list[StoredBlock]) -> None:
        if self.publisher is None:
            return
        start = 0
        for i in range(1, len(blocks) + 1):  # one event per run of blocks that chain
            if i == len(blocks) or blocks[i].parent != blocks[i - 1].id:
                run = blocks[start:i]
                self.publisher.publish_stored(
                    token_ids=[t for b in run for t in b.tokens],
                    num_block_tokens=[len(b.tokens) for b in run],
                    block_hashes=[b.id for b in run],
                    parent_hash=run[0].parent,
                )
                start = i
        self.stored_blocks += len(blocks)

    def removed(self, worker: str, ids: list[int]) -> None:
        if self.publisher is not None:
            self.publisher.publish_removed(ids)
        self.removed_blocks += len(ids)


def snapshot(stats: EngineStats) -> ComponentSnapshot | None:
    """The node's worker's load, in logical blocks (block_size positions on every plane)."""
    w = next((w for w in stats.workers if w.pid is not None and w.state == "ready"), None)
    if w is None or not w.kv_blocks_total:
        return None
    total, used = (
        w.kv_blocks_total // w.kv_planes,
        (w.kv_blocks_total - w.kv_blocks_free) // w.kv_planes,
    )
    rate = w.prefix_cache.hit_rate if w.prefix_cache.queried_tokens else None
    return ComponentSnapshot(
        kv_used_blocks=used,
        kv_total_blocks=total,
        gpu_cache_usage=used / total,
        dp_rank=0,
        kv_cache_hit_rate=rate,
    )


class NodeWatch:
    """A task on the node's loop: the load snapshot to Dynamo when it changes, and the endpoint out
    of discovery while the worker cannot serve."""

    def __init__(self, node):
        """node: the RltEngine, its rlt.Engine started; its `snapshots` (Dynamo's SnapshotPublisher)
        and `endpoint` (the served Endpoint) are read as Dynamo hands them over."""
        self.node, self.engine = node, node.engine
        self.serving = True
        self._last = None
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self._tick()
            except Exception:  # noqa: BLE001 - a failed publish must not end the watch
                log.exception("rlt node: load or health update failed")
            await asyncio.sleep(LOAD_PERIOD_S)

    async def _tick(self) -> None:
        try:
            await self.engine.check_health()
            healthy, why = True, None
        except EngineDeadError as e:
            healthy, why = False, str(e)
        endpoint = self.node.endpoint
        if healthy != self.serving and endpoint is not None:
            if healthy:
                await endpoint.register_endpoint_instance()
                log.warning("rlt node: its worker is ready again; back in discovery")
            else:
                await endpoint.unregister_endpoint_instance()
                log.warning(
                    "rlt node cannot serve (%s): out of discovery until its worker is back", why
                )
            self.serving = healthy
        snap = snapshot(self.engine.stats())
        if self.node.snapshots is not None and snap is not None and snap != self._last:
            self.node.snapshots.publish(0, snap)
            self._last = snap

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class RouterHooks:
    """The LLMEngine methods Dynamo's worker calls for the above (RltEngine's: its `engine`,
    `launch`, `served_name` and `kv_events`)."""

    async def kv_event_sources(self) -> list:
        caching = self.launch.engine.engine_config.enable_prefix_caching
        return [PushSource(on_ready=self.kv_events.attach)] if caching else []

    def component_metrics_dp_ranks(self) -> list[int]:
        return [0]

    def attach_snapshot_publisher(self, publisher) -> None:
        self.snapshots = publisher

    async def on_endpoint_ready(self, endpoint) -> None:
        self.endpoint = endpoint

    async def health_check_payload(self) -> dict:
        """One greedy token from BOS, as Dynamo's backends' canary (the request is flagged: it goes
        through the worker like any other, after the node's own check)."""
        bos = self.launch.engine.model_config.bos_token_id
        return build_health_check_payload(bos if bos is not None else 0)

    async def register_prometheus(self, metrics) -> None:
        """rlt's `rlt:` metrics (rlt/frontends/metrics.py) in Dynamo's /metrics, with the node's
        labels."""
        from rlt.frontends.metrics import Metrics

        e = self.launch.engine  # (the rlt.Engine, launched or not: stats() is read at each scrape)
        self.metrics = Metrics(e, e.model_config.depth, self.served_name)
        register_engine_registry(metrics, self.metrics.registry, prefix_filters=["rlt:"])

    def observe(self, out, n: int) -> None:
        """rlt's per-token metrics for what a delta output carried, its choice's n tokens so far (the
        rest is read from stats())."""
        m = self.metrics
        m.per_token.add(out.exit_depths, len(out.token_ids))
        if out.finished:
            m.prompt_tokens.inc(len(out.prompt_token_ids))
            m.success(out.finish_reason).inc()
            t = out.metrics  # the engine's times (Dynamo's frontend has the client's)
            for histogram, begin, end in (
                (m.ttft, t.arrival_time, t.first_token_time),
                (m.e2e, t.arrival_time, t.finished_time),
                (m.queue, t.arrival_time, t.scheduled_time),
                (m.prefill, t.scheduled_time, t.first_token_time),
                (m.decode, t.first_token_time, t.finished_time),
            ):
                if begin is not None and end is not None:
                    histogram.observe(end - begin)
            if n > 1 and t.first_token_time is not None and t.finished_time is not None:
                m.tpot.observe((t.finished_time - t.first_token_time) / (n - 1))
