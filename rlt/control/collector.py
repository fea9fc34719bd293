"""Per-request output collector: one slot + an event (never an unbounded queue).

The worker's tokens are merged into the request's cumulative lists as they arrive; a slow consumer
just sees a bigger step next time. An exception (engine death) replaces whatever is pending. The
n choices of one call share the stream's event: `dirty` says which of them moved.
"""

import asyncio
import time

from rlt.control.outputs import RequestOutput


class Collector:
    def __init__(self, out: RequestOutput, wake: asyncio.Event):
        self.out = out
        self.dirty = False  # something new since the last take()
        self._wake = wake
        self._error: BaseException | None = None

    def push(self, token: int, depth: int, logprobs, finish: str | None) -> None:
        o = self.out
        if not o.token_ids:
            o.metrics.first_token_time = time.monotonic()
        o.token_ids.append(token)
        o.exit_depths.append(depth)
        if o.logprobs is not None:
            o.logprobs.append(logprobs)
        if finish is not None:
            o.finished, o.finish_reason = True, finish
            o.metrics.finished_time = time.monotonic()
        self._notify()

    def finish(self, reason: str, error: str | None = None) -> None:
        if not self.out.finished:
            self.out.finished, self.out.finish_reason, self.out.error = True, reason, error
            self.out.metrics.finished_time = time.monotonic()
            self._notify()

    def fail(self, exc: BaseException) -> None:
        self._error = exc
        self._notify()

    def _notify(self) -> None:
        self.dirty = True
        self._wake.set()

    def take(self, snapshot: bool = True) -> RequestOutput:
        """The current state (dirty): with `snapshot`, a shallow copy the consumer may keep while
        the lists grow (the last one is the collector's own); else the collector's own (a consumer
        that takes what is new from it at once: O(new) a take, not O(all))."""
        self.dirty = False
        if self._error is not None:
            raise self._error
        o = self.out
        if o.finished or not snapshot:
            return o
        return RequestOutput(
            o.request_id,
            o.prompt_token_ids,
            list(o.token_ids),
            list(o.exit_depths),
            o.text,
            logprobs=None if o.logprobs is None else list(o.logprobs),
            index=o.index,
            prompt_logprobs=o.prompt_logprobs,
            metrics=o.metrics,
        )
