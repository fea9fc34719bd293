"""GET /metrics: Prometheus text through prometheus_client, under vLLM's metric names with an
`rlt:` prefix, and what only rlt has: the exit depth of every generated token and, in PD, the KV
handed from prefill to decode workers.

Every metric carries the label model_name (the first served name), as vLLM's. Per-request latencies
are measured here, on each stream as the client sees it (TTFT, TPOT, ITL, E2E); engine state
(requests running and waiting, KV blocks in use, preemptions, prefix cache, KV handoff) is read from
engine.stats() at each scrape.

A request's phases, vLLM's queue / prefill / decode histograms: queue = from its arrival at the
engine until a worker was given it, prefill = from then to its first token, decode = from its first
token to its end. Only the engine sees the first two apart: they come from the engine's own times
(`out.metrics`, rlt.control.outputs.RequestMetrics: arrival_time, scheduled_time, first_token_time,
finished_time, time.monotonic() seconds) where a RequestOutput carries them, else they are not
observed; decode then falls back to what the server sees (its first token here to its end).
"""

import itertools
import time
from bisect import bisect_left

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

_LATENCY = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
)
LABELS = ["model_name"]
_REQUEST = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
)


class _EngineState:
    def __init__(self, engine, model_name: str):
        self.engine, self.model_name = engine, model_name

    def collect(self):
        st = self.engine.stats()
        ws = st.workers
        total, free = sum(w.kv_blocks_total for w in ws), sum(w.kv_blocks_free for w in ws)
        for name, doc, value in (
            (
                "rlt:num_requests_running",
                "requests running on the workers",
                sum(w.running for w in ws),
            ),
            (
                "rlt:num_requests_waiting",
                "requests waiting: on the workers, or in the coordinator for a worker with room",
                sum(w.waiting for w in ws) + st.queued_requests,
            ),
            (
                "rlt:kv_cache_usage_perc",
                "share of KV blocks in use (1 = full)",
                (total - free) / total if total else 0,
            ),
            (
                "rlt:prefix_cache_blocks",
                "KV blocks holding cached prefixes (those no request uses count as free)",
                st.prefix_cache.cached_blocks,
            ),
        ):
            yield self._one(GaugeMetricFamily(name, doc, labels=LABELS), value)
        for name, doc, value in (
            (
                "rlt:num_preemptions",
                "requests preempted (resumed by recompute)",
                sum(w.preemptions for w in ws),
            ),
            (
                "rlt:spec_decode_num_drafts",
                "self-speculation rounds verified",
                sum(w.spec_rounds for w in ws),
            ),
            (
                "rlt:spec_decode_num_draft_tokens",
                "self-speculation: draft tokens checked",
                sum(w.spec_draft_tokens for w in ws),
            ),
            (
                "rlt:spec_decode_num_accepted_tokens",
                "self-speculation: draft tokens equal to the full depth's",
                sum(w.spec_accepted_tokens for w in ws),
            ),
            (
                "rlt:prefix_cache_queries",
                "prompt tokens looked up in the prefix cache",
                st.prefix_cache.queried_tokens,
            ),
            (
                "rlt:prefix_cache_hits",
                "prompt tokens found in the prefix cache",
                st.prefix_cache.hit_tokens,
            ),
            (
                "rlt:kv_handoff_bytes",
                "PD: KV bytes written from prefill to decode workers",
                st.kv_bytes,
            ),
            (
                "rlt:kv_handoff_seconds",
                "PD: seconds from a prompt's Prefill to its last KV write, summed",
                st.kv_seconds,
            ),
        ):
            yield self._one(CounterMetricFamily(name, doc, labels=LABELS), value)

    def _one(self, family, value):
        family.add_metric([self.model_name], value)
        return family


class _TokenHistogram:
    """A histogram observed for every streamed token, kept as plain numbers and exposed at each
    scrape (_PerToken): prometheus_client's Histogram.observe takes a lock and scans its buckets on
    every call (its Counter.inc a lock), on the server's per-token path. Buckets as its: v <= bound."""

    def __init__(self, name: str, doc: str, bounds):
        self.name, self.doc, self.bounds = name, doc, [float(b) for b in bounds]
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.sum += value * times

    def family(self, model_name: str) -> HistogramMetricFamily:
        cumulative = list(itertools.accumulate(list(self.counts)))
        buckets = [(floatToGoString(b), c) for b, c in zip(self.bounds, cumulative)] + [
            ("+Inf", cumulative[-1])
        ]
        family = HistogramMetricFamily(self.name, self.doc, labels=LABELS)
        family.add_metric([model_name], buckets, self.sum)
        return family


class _PerToken:
    """What every streamed token updates: generated tokens, inter-token latency, exit depth."""

    def __init__(self, depth: int, model_name: str):
        self.model_name, self.generated = model_name, 0
        self.itl = _TokenHistogram("rlt:inter_token_latency_seconds", "ITL", _LATENCY)
        self.depth = _TokenHistogram(
            "rlt:exit_depth", "loop depth each generated token exited at", range(1, depth + 1)
        )

    def add(self, depths, n: int) -> None:
        """n more generated tokens, exiting at depths."""
        for d in depths:
            self.depth.observe(d)
        self.generated += n

    def collect(self):
        tokens = CounterMetricFamily("rlt:generation_tokens", "generated tokens", labels=LABELS)
        tokens.add_metric([self.model_name], self.generated)
        yield tokens
        yield self.itl.family(self.model_name)
        yield self.depth.family(self.model_name)


class Metrics:
    def __init__(self, engine, depth: int, model_name: str = "default"):
        r = self.registry = CollectorRegistry()
        self.model_name = model_name

        def one(kind, name, doc, **kw):  # the metric's only child: this model's
            return kind(name, doc, LABELS, registry=r, **kw).labels(model_name)

        self.prompt_tokens = one(Counter, "rlt:prompt_tokens", "prompt tokens")
        self.per_token = _PerToken(depth, model_name)
        r.register(self.per_token)
        self._success = Counter(
            "rlt:request_success", "finished requests", [*LABELS, "finished_reason"], registry=r
        )
        self.ttft = one(Histogram, "rlt:time_to_first_token_seconds", "TTFT", buckets=_LATENCY)
        self.tpot = one(Histogram, "rlt:time_per_output_token_seconds", "TPOT", buckets=_LATENCY)
        self.e2e = one(
            Histogram, "rlt:e2e_request_latency_seconds", "E2E latency", buckets=_REQUEST
        )
        self.queue = one(
            Histogram,
            "rlt:request_queue_time_seconds",
            "seconds waiting for a worker (engine's times)",
            buckets=_REQUEST,
        )
        self.prefill = one(
            Histogram,
            "rlt:request_prefill_time_seconds",
            "seconds from a worker taking the request to its first token (engine's times)",
            buckets=_REQUEST,
        )
        self.decode = one(
            Histogram,
            "rlt:request_decode_time_seconds",
            "seconds from the first token to the end",
            buckets=_REQUEST,
        )
        r.register(_EngineState(engine, model_name))

    def success(self, reason: str):
        return self._success.labels(self.model_name, reason)

    def request(self, record=None) -> "_Timing":
        """record: the HTTP request's RequestRecord (rlt/serve/middleware.py), given TTFT and
        completion tokens as they come (None: only the metrics)."""
        return _Timing(self, record)


class _Timing:
    """One request's stream, observed as its outputs arrive."""

    def __init__(self, m: Metrics, record=None):
        self.m, self.record, self.start, self.last, self.first, self.tokens = (
            m,
            record,
            time.monotonic(),
            None,
            None,
            0,
        )
        self.out = None

    def output(self, out) -> None:
        """The engine's next delta output."""
        self.out = out
        now, new = time.monotonic(), len(out.token_ids)
        if new <= 0:
            return
        if self.record is not None:
            self.record.completion_tokens = (self.record.completion_tokens or 0) + new
        if self.first is None:
            self.first = now
            self.m.ttft.observe(now - self.start)
            self.m.prompt_tokens.inc(len(out.prompt_token_ids))
            # (a call's first choice to get one)
            if self.record is not None and self.record.ttft is None:
                self.record.ttft = now - self.record.start
        elif self.last is not None:
            self.m.per_token.itl.observe((now - self.last) / new, new)
        self.m.per_token.add(out.exit_depths, new)
        self.tokens, self.last = self.tokens + new, now

    def finished(self, reason: str | None) -> None:
        now = time.monotonic()
        self.m.e2e.observe(now - self.start)
        if self.first is not None and self.tokens > 1:
            self.m.tpot.observe((now - self.first) / (self.tokens - 1))
        self.m.success(reason or "abort").inc()
        t = self.out.metrics if self.out is not None else None  # the engine's phase times
        for histogram, begin, end in (
            (self.m.queue, t and t.arrival_time, t and t.scheduled_time),
            (self.m.prefill, t and t.scheduled_time, t and t.first_token_time),
            (self.m.decode, t and t.first_token_time, t and t.finished_time),
        ):
            if begin is not None and end is not None:
                histogram.observe(end - begin)
