"""A response's choices: each one's stream of engine outputs turned into text (stop strings checked
on the incremental text, held back while one may be forming), and the server-sent events of a
streamed response, bounded per client."""

import asyncio

import msgspec

from rlt.serve import errors
from rlt.serve import openai_api as oa

_json = msgspec.json.Encoder()  # server-sent events: several times json.dumps's speed
PENDING_CHUNKS = 8  # a stream's chunks waiting for its client beyond one per choice (then its choices wait)


class Choice:
    """One choice's stream: text with stop strings checked on the incremental text and trimmed."""

    def __init__(self, index: int, prompt_ids: list[int], stream, parsed: oa.Parsed, timing, tokenizer):
        self.index, self.prompt_ids, self.stream = index, prompt_ids, stream
        self.parsed, self.timing, self.tokenizer = parsed, timing, tokenizer
        self.out, self.text, self.finish, self.sent, self.tokens_sent = None, "", None, 0, 0
        self.lp_sent, self.lp_offset = 0, 0  # streamed logprobs: positions and characters
        self.hold = max((len(s) for s in parsed.stop), default=1) - 1  # a stop string may still be forming

    async def run(self, emit) -> None:
        try:
            await self._run(emit)
        finally:  # finished, stopped, or its client went away (cancelled): observed once
            self.timing.finished(self.finish)

    async def _run(self, emit) -> None:
        checked = 0
        async for out in self.stream:
            self.timing.output(out)
            self.out, text = out, out.text
            cut = oa.find_stop(text, self.parsed.stop, checked) if self.parsed.stop else None
            checked = len(text)
            if cut is not None:
                self.text, self.finish = text[:cut], "stop"
                await self.stream.aclose()  # the rest is not wanted: abort
            else:
                self.text, self.finish = text, out.finish_reason
            if emit is not None:
                await emit(self)
            if self.finish is not None:
                return

    def delta(self) -> tuple[str, list[int], list[int]]:
        """Text (holding back what may become a stop string), and the token ids and their exit
        depths, not sent yet."""
        end = len(self.text) if self.finish is not None else max(self.sent, len(self.text) - self.hold)
        text, self.sent = self.text[self.sent : end], end
        if self.out is None:
            return text, [], []
        ids, depths = self.out.token_ids[self.tokens_sent :], self.out.exit_depths[self.tokens_sent :]
        self.tokens_sent += len(ids)
        return text, ids, depths

    def logprobs(self, chat: bool) -> dict | None:
        """Logprobs of the tokens not sent yet (None unless asked for)."""
        top, out = self.parsed.top_logprobs, self.out
        if top is None or out is None:
            return None
        ids, positions = out.token_ids[self.lp_sent :], out.logprobs[self.lp_sent :]
        piece = oa.logprobs(self.tokenizer, ids, positions, top, chat, self.lp_offset)
        self.lp_sent += len(ids)
        if not chat and piece["tokens"]:
            self.lp_offset = piece["text_offset"][-1] + len(piece["tokens"][-1])
        return piece

    def final(self, chat: bool) -> dict:
        c = {"index": self.index, "finish_reason": self.finish, "logprobs": self.logprobs(chat)}
        if chat:
            c["message"] = {"role": "assistant", "content": self.text}
        else:
            c["text"] = self.text
        if self.parsed.return_exit_depths:
            c["exit_depths"] = self.out.exit_depths if self.out is not None else []
        if self.parsed.return_token_ids:
            c["token_ids"] = self.out.token_ids if self.out is not None else []
            if not chat:  # chat has the prompt's once, beside the choices (as vLLM)
                c["prompt_token_ids"] = self.prompt_ids
        return c


async def events(choices: list[Choice], rid: str, kind: str, name: str, chat: bool, parsed: oa.Parsed):
    queue: asyncio.Queue = asyncio.Queue()  # chunks to send, and None as each choice ends
    room, most = asyncio.Event(), len(choices) + PENDING_CHUNKS

    async def put(item: bytes) -> None:
        """A client that reads slower than tokens come makes its choices wait here: their tokens
        gather in one output each (memory bounded), and go out together once it reads."""
        while queue.qsize() >= most:
            room.clear()
            await room.wait()
        queue.put_nowait(item)

    chunk_kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choice_list, usage=None, prompt_token_ids=None) -> str:
        d = {"id": rid, "object": chunk_kind, "created": oa.created(), "model": name, "choices": choice_list}
        if prompt_token_ids is not None:
            d["prompt_token_ids"] = prompt_token_ids
        if parsed.include_usage:
            d["usage"] = usage
        return b"data: " + _json.encode(d) + b"\n\n"

    async def emit(c: Choice) -> None:
        text, ids, depths = c.delta()
        if not text and c.finish is None and not (ids and parsed.return_token_ids):
            return
        entry = {"index": c.index, "finish_reason": c.finish, "logprobs": c.logprobs(chat)}
        if chat:
            entry["delta"] = {"content": text}
        else:
            entry["text"] = text
        if parsed.return_exit_depths:
            entry["exit_depths"] = depths
        if parsed.return_token_ids:
            entry["token_ids"] = ids
            if not chat and len(ids) == c.tokens_sent:  # a choice's first chunk carries its prompt's
                entry["prompt_token_ids"] = c.prompt_ids
        await put(chunk([entry]))

    async def run(c: Choice) -> None:
        try:
            await c.run(emit)
        except Exception as e:  # noqa: BLE001 - reported in the stream, which has started
            await put(b"data: " + _json.encode(errors.in_stream(e)) + b"\n\n")
        finally:
            queue.put_nowait(None)  # this choice is over

    tasks = [asyncio.ensure_future(run(c)) for c in choices]
    try:
        if chat:
            first = [{"index": c.index, "delta": {"role": "assistant", "content": ""}} for c in choices]
            yield chunk(first, prompt_token_ids=choices[0].prompt_ids if parsed.return_token_ids else None)
        running = len(tasks)
        while running:
            item = await queue.get()
            room.set()
            if item is None:
                running -= 1
            else:
                yield item
        if parsed.include_usage:
            firsts = choices[:: len(parsed.params)]  # one choice per prompt
            prompt_tokens = sum(len(c.prompt_ids) for c in firsts)
            cached = sum(c.out.num_cached_tokens or 0 for c in firsts if c.out)
            out_tokens = sum(len(c.out.token_ids) for c in choices if c.out)
            yield chunk([], oa.usage(prompt_tokens, out_tokens, cached))
        yield b"data: [DONE]\n\n"
    finally:  # finished, or the client went away: every stream closes (an unfinished one aborts)
        for t in tasks:
            t.cancel()
        for c in choices:
            await c.stream.aclose()
