"""GET /metrics: Prometheus text through prometheus_client, under vLLM's metric names with an
`rlt:` prefix, and what only rlt has: the exit depth of every generated token and, in PD, the KV
handed from prefill to decode workers.

Per-request latencies are measured here, on each stream as the client sees it (TTFT, TPOT, ITL,
E2E); engine state (requests running and waiting, KV blocks in use, preemptions, prefix cache, KV handoff) is
read from engine.stats() at each scrape.
"""

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
_REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0)


class _EngineState:
    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        st = self.engine.stats()
        ws = st["workers"]
        total, free = sum(w["kv_blocks_total"] for w in ws), sum(w["kv_blocks_free"] for w in ws)
        for name, doc, value in (
            ("rlt:num_requests_running", "requests running on the workers", sum(w["running"] for w in ws)),
            (
                "rlt:num_requests_waiting",
                "requests waiting: on the workers, or in the coordinator for a worker with room",
                sum(w["waiting"] for w in ws) + st["queued_requests"],
            ),
            ("rlt:kv_cache_usage_perc", "share of KV blocks in use (1 = full)", (total - free) / total if total else 0),
            (
                "rlt:prefix_cache_blocks",
                "KV blocks holding cached prefixes (those no request uses count as free)",
                sum(w["prefix_cached_blocks"] for w in ws),
            ),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
        for name, doc, value in (
            ("rlt:num_preemptions", "requests preempted (resumed by recompute)", sum(w["preemptions"] for w in ws)),
            (
                "rlt:prefix_cache_queries",
                "prompt tokens looked up in the prefix cache",
                sum(w["prefix_queried_tokens"] for w in ws),
            ),
            (
                "rlt:prefix_cache_hits",
                "prompt tokens found in the prefix cache",
                sum(w["prefix_hit_tokens"] for w in ws),
            ),
            ("rlt:kv_handoff_bytes", "PD: KV bytes written from prefill to decode workers", st["kv_bytes"]),
            (
                "rlt:kv_handoff_seconds",
                "PD: seconds from a prompt's Prefill to its last KV write, summed",
                st["kv_seconds"],
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)


class Metrics:
    def __init__(self, engine, depth: int):
        r = self.registry = CollectorRegistry()
        self.prompt_tokens = Counter("rlt:prompt_tokens", "prompt tokens", registry=r)
        self.generation_tokens = Counter("rlt:generation_tokens", "generated tokens", registry=r)
        self.success = Counter("rlt:request_success", "finished requests", ["finished_reason"], registry=r)
        self.ttft = Histogram("rlt:time_to_first_token_seconds", "TTFT", buckets=_LATENCY, registry=r)
        self.tpot = Histogram("rlt:time_per_output_token_seconds", "TPOT", buckets=_LATENCY, registry=r)
        self.itl = Histogram("rlt:inter_token_latency_seconds", "ITL", buckets=_LATENCY, registry=r)
        self.e2e = Histogram("rlt:e2e_request_latency_seconds", "E2E latency", buckets=_REQUEST, registry=r)
        self.depth = Histogram(
            "rlt:exit_depth", "loop depth each generated token exited at", buckets=range(1, depth + 1), registry=r
        )
        r.register(_EngineState(engine))

    def request(self) -> "_Timing":
        return _Timing(self)


class _Timing:
    """One request's stream, observed as its outputs arrive."""

    def __init__(self, m: Metrics):
        self.m, self.start, self.last, self.first, self.tokens = m, time.monotonic(), None, None, 0

    def output(self, out) -> None:
        now, new = time.monotonic(), len(out.token_ids) - self.tokens
        if new <= 0:
            return
        if self.first is None:
            self.first = now
            self.m.ttft.observe(now - self.start)
            self.m.prompt_tokens.inc(len(out.prompt_token_ids))
        elif self.last is not None:
            for _ in range(new):
                self.m.itl.observe((now - self.last) / new)
        for d in out.exit_depths[self.tokens :]:
            self.m.depth.observe(d)
        self.m.generation_tokens.inc(new)
        self.tokens, self.last = len(out.token_ids), now

    def finished(self, reason: str | None) -> None:
        now = time.monotonic()
        self.m.e2e.observe(now - self.start)
        if self.first is not None and self.tokens > 1:
            self.m.tpot.observe((now - self.first) / (self.tokens - 1))
        self.m.success.labels(finished_reason=reason or "abort").inc()
