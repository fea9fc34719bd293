"""A response's choices: each prompt's engine stream (its n choices, tagged by index) routed to the
choices, what each has sent, and the server-sent events of a streamed response, bounded per client.
The engine streams deltas (output_kind "delta": what is new, its text final, stop strings and
characters still forming held back there), so a chunk is one engine output, even when its text is
empty."""

import asyncio
import contextlib

import msgspec

from rlt.frontends.parsers import assemble
from rlt.serve import errors
from rlt.serve import openai_api as oa
from rlt.serve.requests import Options

_json = msgspec.json.Encoder()  # server-sent events: several times json.dumps's speed
# a stream's chunks waiting for its client beyond one per choice (then its choices wait)
PENDING_CHUNKS = 8


class Choice:
    """One choice: the engine's outputs for it ("delta" outputs: what is new each time), gathered for
    the whole response, and what its next chunk sends."""

    def __init__(
        self, index: int, prompt_ids: list[int], echo: str, opts: Options, timing, text_of
    ):
        self.index, self.prompt_ids, self.echo, self.opts = index, prompt_ids, echo, opts
        self.timing, self.text_of = timing, text_of
        self.out, self.started = None, False  # the engine's latest output; a chunk went out
        # everything generated so far
        self.ids, self.depths, self.positions, self.pieces = [], [], [], []
        self.prompt_positions, self.lp_offset = None, 0
        # (a stream's parsers)
        self.split = opts.parsing.new() if opts.parsing is not None else None

    def take(self, out) -> None:
        """The engine's next delta (echo with max_tokens 0 shows none of its one token: it only ran
        the prompt)."""
        self.timing.output(out)
        self.out = out
        if out.prompt_logprobs is not None:
            self.prompt_positions = out.prompt_logprobs
        if self.opts.zero_tokens:
            out.token_ids, out.exit_depths, out.logprobs, out.text = [], [], [], ""
        self.ids += out.token_ids
        self.depths += out.exit_depths
        if out.logprobs is not None:
            self.positions += out.logprobs
        self.pieces.append(out.text)

    @property
    def finish(self) -> str | None:
        return self.out.finish_reason if self.out is not None and self.out.finished else None

    def _finish(self, split) -> str | None:
        """The finish reason a response gives: a stop after tool calls is "tool_calls" (as OpenAI)."""
        f = self.finish
        return "tool_calls" if f == "stop" and split is not None and split.any_call else f

    def _message(self, split, text: str, echo: str, final: bool, whole: bool) -> dict:
        """A chat message (whole) or delta: the text through the parsers, if any."""
        if split is None:
            return (
                {"role": "assistant", "content": echo + text} if whole else {"content": echo + text}
            )
        p = split.feed(text, final)
        m, content = {"role": "assistant"} if whole else {}, echo + p.content
        if whole:
            m["content"] = content if content or not p.calls else None
            if self.opts.parsing.reasoning and self.opts.parsing.include_reasoning:
                m["reasoning_content"] = p.reasoning or None
            if p.calls:
                m["tool_calls"] = assemble(p.calls)
            return m
        if p.reasoning:
            m["reasoning_content"] = p.reasoning
        if p.calls:
            m["tool_calls"] = p.calls
        if content or not m:
            m["content"] = content
        return m

    def _logprobs(self, chat: bool, ids: list[int], positions: list, echo: bool) -> dict | None:
        if self.opts.top_logprobs is None or self.out is None:
            return None
        # the prompt's first, its first position None
        if echo and self.prompt_positions is not None:
            ids, positions = self.prompt_ids + ids, self.prompt_positions + positions
        piece = oa.logprobs(
            self.text_of, ids, positions, self.opts.top_logprobs, chat, self.lp_offset
        )
        if not chat and piece["tokens"]:
            self.lp_offset = piece["text_offset"][-1] + len(piece["tokens"][-1])
        return piece

    def _extras(self, c: dict, ids: list[int], depths: list[int], chat: bool, first: bool) -> dict:
        o = self.opts
        if o.return_exit_depths:
            c["exit_depths"] = depths
        if o.return_token_ids:
            c["token_ids"] = ids
            if not chat and first:  # chat has the prompt's once, beside the choices (as vLLM)
                c["prompt_token_ids"] = self.prompt_ids
        # (chat: beside the choices, as vLLM)
        if not chat and first and o.prompt_logprobs is not None:
            c["prompt_logprobs"] = self.prompt_logprobs()
        return c

    def prompt_logprobs(self) -> list | None:
        """vLLM's prompt_logprobs, as the request asked for them."""
        if self.out is None:
            return None
        return oa.prompt_logprobs(
            self.text_of, self.prompt_ids, self.prompt_positions, self.opts.prompt_logprobs
        )

    def delta(self, chat: bool) -> dict | None:
        """The chunk of the engine's latest output; None when it holds nothing (no token, text or finish)."""
        out, first = self.out, not self.started
        if not first and not out.token_ids and not out.text and self.finish is None:
            return None
        echo = first and self.opts.echo
        lps = self._logprobs(chat, out.token_ids, out.logprobs or [], echo)
        c = {"index": self.index, "finish_reason": None, "logprobs": lps}
        if chat:
            c["delta"] = self._message(
                self.split, out.text, self.echo if echo else "", self.finish is not None, False
            )
        else:
            c["text"] = self.echo + out.text if echo else out.text
        c["finish_reason"] = self._finish(self.split)
        self.started = True
        return self._extras(c, out.token_ids, out.exit_depths, chat, first)

    def final(self, chat: bool) -> dict:
        echo, text = self.echo if self.opts.echo else "", "".join(self.pieces)
        c = {
            "index": self.index,
            "finish_reason": None,
            "logprobs": self._logprobs(chat, self.ids, self.positions, self.opts.echo),
        }
        split = self.opts.parsing.new() if self.opts.parsing is not None else None
        if chat:
            c["message"] = self._message(split, text, echo, True, True)
        else:
            c["text"] = echo + text
        c["finish_reason"] = self._finish(split)
        if self.out is not None and self.out.stop_reason is not None:
            c["stop_reason"] = self.out.stop_reason
        return self._extras(c, self.ids, self.depths, chat, True)


async def outputs(stream, choices: list[Choice]):
    """A prompt's engine stream: each output to its choice, which is yielded, until all end."""
    try:
        async for out in stream:
            c = choices[out.index]
            c.take(out)
            yield c
    finally:  # finished, stopped, or its client went away (cancelled): observed once
        for c in choices:
            c.timing.finished(c.finish)


async def run(stream, choices: list[Choice]) -> None:
    """A prompt's engine stream into its choices, to the end (a response sent whole)."""
    async with contextlib.aclosing(outputs(stream, choices)) as each:
        async for _ in each:
            pass


def usage(prompts: list[list[Choice]]) -> dict:
    """Prompt tokens once per prompt, the generated ones of every choice."""
    prompt_tokens = sum(len(cs[0].prompt_ids) for cs in prompts)
    cached = sum(cs[0].out.num_cached_tokens or 0 for cs in prompts if cs[0].out is not None)
    return oa.usage(prompt_tokens, sum(len(c.ids) for cs in prompts for c in cs), cached)


async def events(prompts: list[tuple], rid: str, kind: str, name: str, chat: bool, opts: Options):
    """prompts: (engine stream, its choices) per prompt. One prompt's chunks go out as its stream
    makes them (a client that reads slower than tokens come leaves them to gather in the engine's
    output: memory bounded); several prompts' meet in a bounded queue."""
    every = [c for _, cs in prompts for c in cs]
    chunk_kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choice_list, usage=None, prompt_token_ids=None) -> bytes:
        d = {
            "id": rid,
            "object": chunk_kind,
            "created": oa.created(),
            "model": name,
            "choices": choice_list,
        }
        if prompt_token_ids is not None:
            d["prompt_token_ids"] = prompt_token_ids
        if opts.include_usage or opts.continuous_usage:
            d["usage"] = usage
        return b"data: " + _json.encode(d) + b"\n\n"

    def _usage() -> dict:
        return usage([cs for _, cs in prompts])

    async def prompt_chunks(stream, cs):
        """One prompt's chunks; an error ends them with its own (the response has started)."""
        try:
            async with contextlib.aclosing(outputs(stream, cs)) as each:
                async for c in each:
                    entry = c.delta(chat)
                    if entry is not None:
                        yield chunk([entry], _usage() if opts.continuous_usage else None)
        except Exception as e:  # noqa: BLE001 - reported in the stream
            yield b"data: " + _json.encode(errors.in_stream(e)) + b"\n\n"

    sources = [prompt_chunks(s, cs) for s, cs in prompts]
    body = sources[0] if len(sources) == 1 else merged(sources, len(every) + PENDING_CHUNKS)
    try:
        if chat:
            first = [
                {"index": c.index, "delta": {"role": "assistant", "content": ""}} for c in every
            ]
            ids = every[0].prompt_ids if opts.return_token_ids else None
            yield chunk(first, _usage() if opts.continuous_usage else None, prompt_token_ids=ids)
        async for item in body:
            yield item
        if opts.include_usage:
            yield chunk([], _usage())
        yield b"data: [DONE]\n\n"
    finally:  # finished, or the client went away: every stream closes (an unfinished one aborts)
        await body.aclose()
        for source in sources:
            await source.aclose()
        for s, _ in prompts:
            await s.aclose()


async def merged(sources: list, most: int):
    """The items of several async generators as they come, at most `most` waiting for the reader
    (past that, the sources wait)."""
    queue: asyncio.Queue = asyncio.Queue()  # items, and None as each source ends
    room = asyncio.Event()

    async def drain(source) -> None:
        try:
            async for item in source:
                while queue.qsize() >= most:
                    room.clear()
                    await room.wait()
                queue.put_nowait(item)
        finally:
            queue.put_nowait(None)

    tasks = [asyncio.ensure_future(drain(s)) for s in sources]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            room.set()
            if item is None:
                running -= 1
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
