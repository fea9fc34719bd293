"""The HTTP server: OpenAI's completions and chat completions over rlt.Engine, a client of its
public API in the server's own event loop (uvicorn, uvloop). Every field is checked by the engine
at the call (400 naming it), streams are server-sent events ending in `data: [DONE]`, and a client
that goes away aborts its requests (the response task is cancelled: the streams close)."""

import asyncio
import hmac
from contextlib import contextmanager

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rlt.errors import EngineDeadError, EngineOverloadedError, RequestError
from rlt.serve import errors
from rlt.serve import openai_api as oa
from rlt.serve.errors import HTTPError
from rlt.serve.flags import Limits
from rlt.serve.limits import Pool, check_prompts, decode, read_body, token_ids
from rlt.serve.metrics import Metrics

_json = msgspec.json.Encoder()  # server-sent events: several times json.dumps's speed
PENDING_CHUNKS = 8  # a stream's chunks waiting for its client beyond one per choice (then its choices wait)


@contextmanager
def _bad_request():
    """A RequestError (it names the field first) as a 400 naming it."""
    try:
        yield
    except RequestError as e:
        raise HTTPError(400, str(e), "invalid_request_error", oa.field_named(str(e))) from None


def build_app(engine_factory, served_name: str, api_key: str | None, defaults: dict, limits: Limits | None = None):
    """engine_factory(): an `async with` rlt.Engine launch, entered at start-up; defaults: sampling
    defaults for fields a request leaves out (generation_config.json's, overridden by flags); limits:
    what one request may ask (rlt/serve/limits.py)."""
    limits, pool = limits or Limits(), Pool()

    async def lifespan(app: FastAPI):
        async with engine_factory() as engine:
            app.state.engine = engine
            app.state.metrics = Metrics(engine, engine.model_config.depth)
            app.state.defaults = defaults
            yield

    app = FastAPI(lifespan=lifespan)

    errors.install(app)
    if api_key is not None:
        app.add_middleware(_APIKey, key=api_key)

    @app.get("/health")
    async def health(request: Request):
        try:  # 503 unless every role the topology needs has a ready worker (as vLLM's /health)
            await request.app.state.engine.check_health()
        except EngineDeadError as e:
            raise HTTPError(503, str(e)) from None
        return JSONResponse({})

    @app.get("/version")
    async def version():
        from importlib.metadata import version as v

        return {"version": v("rlt")}

    @app.get("/metrics")
    async def metrics(request: Request):
        return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_name, "object": "model", "created": 0, "owned_by": "rlt"}]}

    async def body_of(request: Request) -> dict:
        body = decode(await read_body(request, limits))
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise HTTPError(400, f"model must be a string, got {errors.short(model)}", param="model")
        if model not in (None, served_name):
            raise HTTPError(404, f"the model {errors.short(model)} does not exist", param="model")
        return body

    @app.post("/v1/completions")
    async def completions(request: Request):
        state, body = request.app.state, await body_of(request)
        with _bad_request():
            parsed = oa.parse(body, False, state.defaults)
            n, max_positions = len(parsed.params), state.engine.model_config.max_positions
            prompts = check_prompts(body.get("prompt"), n, max_positions, limits)
            ids = await pool.run(lambda: [token_ids(state.engine, p) for p in prompts])
        return await _respond(request, parsed, ids, chat=False, name=served_name)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        state, body = request.app.state, await body_of(request)
        with _bad_request():
            parsed = oa.parse(body, True, state.defaults)
            ids = await pool.run(oa.render_chat, state.engine, body.get("messages"))
        return await _respond(request, parsed, [ids], chat=True, name=served_name)

    return app


class _APIKey:
    """/v1 routes need `Authorization: Bearer KEY` (the scheme in any case; the key compared in
    constant time). Plain ASGI (a decorator middleware would relay every streamed chunk through
    another task and queue)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            scheme, _, key = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
            same = hmac.compare_digest(key.strip(), self.key)
            if scheme.lower() != b"bearer" or not same:
                body = errors.body("invalid API key", "authentication_error", 401)
                return await JSONResponse(body, status_code=401)(scope, receive, send)
        await self.app(scope, receive, send)


async def _respond(request: Request, parsed: oa.Parsed, prompts: list[list[int]], chat: bool, name: str):
    """prompts: token ids, checked (tokenized in the pool)."""
    state = request.app.state
    engine, streams = state.engine, []
    try:
        for p, ids in enumerate(prompts):
            for i, sp in enumerate(parsed.params):
                if sp.max_tokens is None:  # chat: up to the context; completions: 16, as OpenAI
                    sp = msgspec.structs.replace(sp, max_tokens=max(1, engine.model_config.max_positions - len(ids)))
                streams.append((len(parsed.params) * p + i, ids, engine.generate(ids, sp)))
    except (RequestError, EngineDeadError, EngineOverloadedError) as e:
        for *_, s in streams:  # those already admitted go
            await s.aclose()
        if isinstance(e, EngineOverloadedError):  # (a call's prompts and choices are admitted whole or not at all)
            raise HTTPError(503, str(e), public=True) from None
        if isinstance(e, EngineDeadError):
            raise HTTPError(503, str(e), "service_unavailable") from None
        raise HTTPError(400, str(e), "invalid_request_error", oa.field_named(str(e))) from None
    rid, kind = oa.new_id("chatcmpl" if chat else "cmpl"), "chat.completion" if chat else "text_completion"
    choices = [_Choice(index, ids, s, parsed, state.metrics.request(), engine.tokenizer) for index, ids, s in streams]
    if parsed.stream:
        return StreamingResponse(_events(choices, rid, kind, name, chat, parsed), media_type="text/event-stream")
    try:
        if not await _unless_disconnected(request, asyncio.gather(*(c.run(None) for c in choices))):
            return Response(status_code=499)  # (nobody reads it: the client went away, its requests are aborted)
    except EngineDeadError as e:  # a worker died under it (a restart is under way)
        raise HTTPError(503, str(e), "service_unavailable") from None
    finally:
        for c in choices:
            await c.stream.aclose()
    firsts = choices[:: len(parsed.params)]  # one choice per prompt
    prompt_tokens, cached = sum(len(c.prompt_ids) for c in firsts), sum(c.out.num_cached_tokens or 0 for c in firsts)
    response = {
        "id": rid,
        "object": kind,
        "created": oa.created(),
        "model": name,
        "choices": [c.final(chat) for c in choices],
        "usage": oa.usage(prompt_tokens, sum(len(c.out.token_ids) for c in choices), cached),
    }
    if chat and parsed.return_token_ids:
        response["prompt_token_ids"] = choices[0].prompt_ids
    return Response(_json.encode(response), media_type="application/json")


async def _unless_disconnected(request: Request, work) -> bool:
    """Run `work` until it ends (True) or the client disconnects (False: it is cancelled). A streamed
    response learns of a disconnect from Starlette, which cancels it; a whole one waits here."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work, gone = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            work.result()  # (its error, if it failed)
            return True
        return False
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)


class _Choice:
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


async def _events(choices: list[_Choice], rid: str, kind: str, name: str, chat: bool, parsed: oa.Parsed):
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

    async def emit(c: _Choice) -> None:
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

    async def run(c: _Choice) -> None:
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
