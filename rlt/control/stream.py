"""RequestStream: what Engine.generate returns, an async iterator of one request's outputs.

Not an async generator: a generator that never started runs no `finally`, so a stream closed or
dropped before its first `__anext__` (or whose consuming task was cancelled before it ran) would
keep its request running. Here closing, cancelling or dropping the stream aborts the request at
any point of its life; aborting is idempotent.
"""

import asyncio

from rlt.control.lifecycle import Lifecycle, Request
from rlt.detokenizer import IncrementalDetokenizer
from rlt.outputs import RequestOutput


class RequestStream:
    def __init__(self, lifecycle: Lifecycle, r: Request, tokenizer):
        self._lifecycle, self._r = lifecycle, r
        self._detok = IncrementalDetokenizer(tokenizer) if tokenizer is not None else None
        self._loop = asyncio.get_running_loop()
        self._done = False

    @property
    def request_id(self) -> str:
        return self._r.request_id

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        try:
            out = await self._r.collector.get()
        except BaseException:  # cancelled, or the engine died: nothing more comes
            self._done = True
            self._abort()
            raise
        if self._detok is not None:  # the output ids decoded on their own, O(new tokens)
            out.text = self._detok.update(out.token_ids, final=out.finished)
        self._done = out.finished
        return out

    async def aclose(self) -> None:
        self._done = True
        self._abort()

    def _abort(self) -> None:
        if not self._r.retired:
            self._lifecycle.cancel(self._r)

    def __del__(self) -> None:
        # dropped unfinished (e.g. its task was cancelled before it ran): abort on the loop's thread
        if not self._r.retired and not self._loop.is_closed():
            self._r.abandoned = True  # (its id may be reused before the abort runs: Engine._admit)
            self._loop.call_soon_threadsafe(self._abort)
