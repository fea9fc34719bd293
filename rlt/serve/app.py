"""The HTTP server: OpenAI's completions and chat completions over rlt.Engine, a client of its
public API in the server's own event loop (uvicorn, uvloop), plus health, version, metrics, models
and vLLM's tokenize/detokenize. The generating routes are rlt/serve/generate.py's; every error is
OpenAI-shaped (rlt/serve/errors.py)."""

import asyncio
import hmac

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rlt.errors import EngineDeadError
from rlt.frontends.metrics import Metrics
from rlt.serve import errors, generate, middleware, responses, template_sandbox
from rlt.serve.errors import HTTPError
from rlt.serve.flags import Limits, ServerOptions
from rlt.serve.limits import Pool, decode, read_body
from rlt.serve.response_objects import Store


def build_app(
    engine_factory,
    served_name: str | list[str],
    api_key: str | None,
    defaults: dict,
    limits: Limits | None = None,
    chat_template: str | None = None,
    options: ServerOptions | None = None,
    parsers: tuple[str | None, str | None] = (None, None),
):
    """engine_factory(): an `async with` rlt.Engine launch, entered at start-up; defaults: sampling
    defaults for fields a request leaves out (generation_config.json's, overridden by flags); limits:
    what one request may ask (rlt/serve/limits.py); chat_template: --chat-template's text; served_name:
    the model's name, or its names (a request may give any; metrics and a request that gives none
    name the first); options: CORS and the request log (rlt/serve/middleware.py); parsers: the
    reasoning and tool-call parsers of chat responses (rlt/frontends/parsers.py; None: none)."""
    names = [served_name] if isinstance(served_name, str) else list(served_name)
    served_name = names[0]
    limits, options = limits or Limits(), options or ServerOptions()
    served = generate.Served(
        limits, Pool(), chat_template, *parsers, options.trust_request_chat_template
    )
    served.responses = Store(options.responses_store)
    template_sandbox.install()

    async def lifespan(app: FastAPI):
        """The engine starts beside the server: the port answers at once, every route with a 503
        saying so until the workers are READY (app.state.start: rlt/serve/shutdown.py waits on it)."""
        launch = engine_factory()
        app.state.starting = True

        async def start():
            engine = await launch.__aenter__()
            app.state.metrics = Metrics(engine, engine.model_config.depth, served_name)
            app.state.defaults = defaults
            app.state.engine, app.state.starting = engine, False

        app.state.start = asyncio.ensure_future(start())
        try:
            yield
        finally:
            app.state.start.cancel()
            await asyncio.gather(app.state.start, return_exceptions=True)
            await launch.__aexit__(None, None, None)

    app = FastAPI(lifespan=lifespan)

    errors.install(app)
    app.add_middleware(_Starting)
    if api_key is not None:
        app.add_middleware(_APIKey, key=api_key)
    middleware.install(app, options)  # CORS around the key check; request ids and log lines

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
        return Response(
            generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    @app.get("/v1/models")
    async def models():
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "rlt"} for name in names]
        return {"object": "list", "data": data}

    async def body_of(request: Request) -> dict:
        body = decode(await read_body(request, limits))
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise HTTPError(
                400, f"model must be a string, got {errors.short(model)}", param="model"
            )
        if model is not None and model not in names:
            raise HTTPError(404, f"the model {errors.short(model)} does not exist", param="model")
        request.state.rlt.model = model or served_name  # (the name the response gives)
        return body

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await body_of(request)
        return await generate.completion(request, body, served, body.get("model") or served_name)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await body_of(request)
        return await generate.chat(request, body, served, body.get("model") or served_name)

    @app.post("/v1/responses")
    async def create_response(request: Request):
        body = await body_of(request)
        return await responses.respond(request, body, served, body.get("model") or served_name)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        return served.responses.get(response_id)[0]

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        return served.responses.delete(response_id)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        return await generate.tokenize(request, await body_of(request), served)

    @app.post("/detokenize")
    async def detokenize(request: Request):
        return await generate.detokenize(request, await body_of(request), served)

    return app


class _Starting:
    """Until the engine is READY, every request gets a 503 saying it is starting (/health too), with
    Retry-After."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and getattr(scope["app"].state, "starting", False):
            body = errors.body(
                "the engine is starting: its workers are not READY yet", "service_unavailable", 503
            )
            return await JSONResponse(body, status_code=503, headers={"Retry-After": "1"})(
                scope, receive, send
            )
        await self.app(scope, receive, send)


class _APIKey:
    """Every route but /health needs `Authorization: Bearer KEY` (the scheme in any case; the key
    compared in constant time): /tokenize renders templates, /metrics tells the load. Plain ASGI (a
    decorator middleware would relay every streamed chunk through another task and queue)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health" and scope["method"] != "OPTIONS":
            scheme, _, key = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
            same = hmac.compare_digest(key.strip(), self.key)
            if scheme.lower() != b"bearer" or not same:
                body = errors.body("invalid API key", "authentication_error", 401)
                return await JSONResponse(body, status_code=401)(scope, receive, send)
        await self.app(scope, receive, send)
