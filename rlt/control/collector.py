"""Per-request output collector: one slot + an event (never an unbounded queue).

The worker's tokens are merged into the request's cumulative lists as they arrive; a slow consumer
just sees a bigger step next time. An exception (engine death) replaces whatever is pending.
"""

import asyncio

from rlt.outputs import RequestOutput


class Collector:
    def __init__(self, out: RequestOutput):
        self.out = out
        self._event = asyncio.Event()
        self._error: BaseException | None = None

    def push(self, token: int, depth: int, logprobs, finish: str | None) -> None:
        o = self.out
        o.token_ids.append(token)
        o.exit_depths.append(depth)
        if o.logprobs is not None:
            o.logprobs.append(logprobs)
        if finish is not None:
            o.finished, o.finish_reason = True, finish
        self._event.set()

    def finish(self, reason: str, error: str | None = None) -> None:
        if not self.out.finished:
            self.out.finished, self.out.finish_reason, self.out.error = True, reason, error
            self._event.set()

    def fail(self, exc: BaseException) -> None:
        self._error = exc
        self._event.set()

    async def get(self) -> RequestOutput:
        """The next state: the last one is the collector's own, earlier ones are snapshots (shallow
        copies: the consumer may keep them while the lists grow)."""
        await self._event.wait()
        self._event.clear()
        if self._error is not None:
            raise self._error
        o = self.out
        if o.finished:
            return o
        return RequestOutput(
            o.request_id,
            o.prompt_token_ids,
            list(o.token_ids),
            list(o.exit_depths),
            o.text,
            logprobs=None if o.logprobs is None else list(o.logprobs),
        )
