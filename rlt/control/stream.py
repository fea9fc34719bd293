"""RequestStream: what Engine.generate returns, an async iterator of one call's outputs (its n
choices, each output tagged with its index), in the call's output kind (vLLM's RequestOutputKind):
"cumulative" (each output holds everything so far), "delta" (only what is new since the choice's
last output: ids, depths, logprobs, text; prompt logprobs in its first) or "final_only" (one
output per choice, when it ends).

Each choice's output ids are detokenized incrementally and checked for the call's stop strings: the
text grows only (a character still forming, and the last characters that may begin a stop string,
are held back until settled); a stop string ends the choice at the token that completed it (its
token ids, logprobs and text end there) and aborts the rest of its generation.

Not an async generator: a generator that never started runs no `finally`, so a stream closed or
dropped before its first `__anext__` (or whose consuming task was cancelled before it ran) would
keep its requests running. Here closing, cancelling or dropping the stream aborts them at any point
of their life; aborting is idempotent.
"""

import asyncio
from collections import deque

from rlt.contract.sampling_params import SamplingParams
from rlt.control.detokenizer import IncrementalDetokenizer
from rlt.control.lifecycle import Lifecycle, Request
from rlt.control.outputs import RequestOutput

OUTPUT_KINDS = ("cumulative", "delta", "final_only")


class _Choice:
    """One choice: its request, its text, and the stop strings checked on the text as it becomes final."""

    def __init__(self, r: Request, tokenizer, p: SamplingParams, stop: list[str]):
        self.r, self.stop, self.include_stop = r, stop, p.include_stop_str_in_output
        self.detok = (
            IncrementalDetokenizer(tokenizer, p.skip_special_tokens)
            if tokenizer is not None
            else None
        )
        # final text in which a stop string may have begun
        self.span = max(map(len, stop), default=1) - 1
        # (with the stop kept, nothing sent is ever cut)
        self.hold = 0 if self.include_stop else self.span
        # the final text's last `span` characters, and its length
        self.recent, self.final_len = "", 0
        self.done = False
        self.sent_tokens, self.sent_text, self.started = 0, 0, False  # what went out ("delta")

    def delta(self, out: RequestOutput) -> RequestOutput:
        """What is new in `out` (the collector's own, cumulative) since this choice's last delta."""
        t, c, first = self.sent_tokens, self.sent_text, not self.started
        self.sent_tokens, self.sent_text, self.started = len(out.token_ids), len(out.text), True
        return RequestOutput(
            out.request_id,
            out.prompt_token_ids,
            out.token_ids[t:],
            out.exit_depths[t:],
            out.text[c:],
            out.finished,
            out.finish_reason,
            None if out.logprobs is None else out.logprobs[t:],
            out.error,
            out.num_cached_tokens,
            out.index,
            out.stop_reason,
            out.prompt_logprobs if first else None,
            out.metrics,
        )

    def process(self, out: RequestOutput, lifecycle: Lifecycle) -> RequestOutput:
        detok, p = self.detok, self.r.params
        if detok is not None:
            hit = self._push(out) if self.stop else None
            if hit is None:
                # (what _push left: nothing, or all)
                detok.update(out.token_ids, final=out.finished)
                out.text = (
                    detok.text
                    if out.finished
                    else detok.text[: max(0, detok.stable_len - self.hold)]
                )
            else:
                self._stop(out, *hit, lifecycle)
        if out.finish_reason == "stop" and out.stop_reason is None and out.token_ids[-1:] != []:
            last = out.token_ids[-1]
            out.stop_reason = last if last in p.stop_token_ids else None
        self.done = out.finished
        return out

    def _push(self, out: RequestOutput) -> tuple[int, int, str] | None:
        """Push the new ids one at a time, looking for a stop string that ends in each one's final
        text: (index of the token that completed it, where it starts in the text, the string)."""
        detok, ids, span, min_tokens = (
            self.detok,
            out.token_ids,
            self.span,
            self.r.params.min_tokens,
        )
        for i in range(detok.num_tokens, len(ids)):
            # (a finished output's open character: update() below)
            delta = detok.push(ids[i : i + 1])
            if not delta:
                continue
            window, k = self.recent + delta, len(self.recent)
            if i + 1 >= min_tokens:  # (as vLLM: stop strings count once min_tokens are out)
                hits = [
                    (j, s) for s in self.stop if (j := window.find(s, max(0, k - len(s) + 1))) >= 0
                ]
                if hits:
                    j, s = min(hits)
                    return i, self.final_len - k + j, s
            self.final_len += len(delta)
            self.recent = window[max(0, len(window) - span) :]
        return None

    def _stop(self, out: RequestOutput, i: int, start: int, s: str, lifecycle: Lifecycle) -> None:
        """End the choice at token i, its text before the stop string (or after it, kept)."""
        if not self.r.retired:
            lifecycle.cancel(self.r)  # the rest is not wanted
        out.token_ids, out.exit_depths = out.token_ids[: i + 1], out.exit_depths[: i + 1]
        if out.logprobs is not None:
            out.logprobs = out.logprobs[: i + 1]
        out.text = self.detok.text[: start + len(s) if self.include_stop else start]
        out.finished, out.finish_reason, out.stop_reason, out.error = True, "stop", s, None


class RequestStream:
    def __init__(
        self,
        lifecycle: Lifecycle,
        request_id: str,
        requests: list[Request],
        tokenizer,
        p,
        stop,
        wake,
        kind,
    ):
        """requests: the call's choices, in index order, their collectors sharing `wake`; kind: the
        output kind (OUTPUT_KINDS)."""
        self._lifecycle, self.request_id, self._wake, self._kind = lifecycle, request_id, wake, kind
        self._choices = [_Choice(r, tokenizer, p, stop) for r in requests]
        self._ready: deque[RequestOutput] = deque()
        self._open = len(requests)  # choices not finished
        self._loop = asyncio.get_running_loop()

    @property
    def finished(self) -> bool:
        return self._open == 0

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        while not self._ready:
            if self._open == 0:
                raise StopAsyncIteration
            try:
                await self._wake.wait()
                self._wake.clear()
                for c in self._choices:
                    if c.r.collector.dirty and not c.done:
                        out = c.process(
                            c.r.collector.take(self._kind == "cumulative"), self._lifecycle
                        )
                        self._open -= out.finished
                        if self._kind == "delta":
                            self._ready.append(c.delta(out))
                        elif out.finished or self._kind == "cumulative":
                            self._ready.append(out)
            except BaseException:  # cancelled, or the engine died: nothing more comes
                self._open = 0
                self._abort()
                raise
        return self._ready.popleft()

    async def aclose(self) -> None:
        self._open = 0
        self._abort()

    def _abort(self) -> None:
        for c in self._choices:
            if not c.r.retired:
                self._lifecycle.cancel(c.r)

    def __del__(self) -> None:
        # dropped unfinished (e.g. its task was cancelled before it ran): abort on the loop's thread
        live = [c.r for c in self._choices if not c.r.retired]
        if live and not self._loop.is_closed():
            for r in live:
                r.abandoned = True  # (its id may be reused before the abort runs: Engine._admit)
            self._loop.call_soon_threadsafe(self._abort)
