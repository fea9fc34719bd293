"""The HTTP server: OpenAI's completions and chat completions over rlt.Engine, a client of its
public API in the server's own event loop (uvicorn, uvloop). Every field is checked by the engine
at the call (400 naming it), streams are server-sent events ending in `data: [DONE]`
(rlt/serve/choices.py), and a client that goes away aborts its requests (a stream's response is
cancelled by Starlette; a whole response watches for the disconnect while it waits)."""

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
from rlt.serve.choices import Choice, events
from rlt.serve.errors import HTTPError
from rlt.serve.flags import Limits
from rlt.serve.limits import Pool, check_prompts, decode, read_body, token_ids
from rlt.serve.metrics import Metrics

_json = msgspec.json.Encoder()


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
    choices = [Choice(index, ids, s, parsed, state.metrics.request(), engine.tokenizer) for index, ids, s in streams]
    if parsed.stream:
        return StreamingResponse(events(choices, rid, kind, name, chat, parsed), media_type="text/event-stream")
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
