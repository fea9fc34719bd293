"""What wraps every HTTP request: its id, its record, its log line, and CORS.

* X-Request-Id: the request's own header (1 to MAX_REQUEST_ID visible ASCII characters), else a
  fresh id, is echoed in the response's X-Request-Id header (a stream's too: it goes with the
  headers), as vLLM's --enable-request-id-headers, always on.
* The request's record, in the ASGI scope for the handlers: `scope["state"]["rlt"]` (Starlette:
  `request.state.rlt`), a RequestRecord; the id alone is `request.state.request_id` too.
* One line per request on the "rlt.serve" logger when its response ends: method, path, status, id,
  prompt and completion tokens and TTFT where the handler recorded them, and the seconds it took.
  INFO (off with --disable-log-requests); every 5xx at WARNING, always.

Plain ASGI, outside Starlette's own stack (ServerErrorMiddleware included: an unhandled exception's
500 gets its id and its line too); a decorator middleware would relay every streamed chunk through
another task and queue. CORS is Starlette's CORSMiddleware, around the API key check (a browser's
preflight carries no key)."""

import logging
import time
import uuid
from dataclasses import dataclass, field

from starlette.middleware.cors import CORSMiddleware

from rlt.serve.errors import clip
from rlt.serve.flags import ServerOptions

log = logging.getLogger("rlt.serve")
MAX_REQUEST_ID = 128  # characters of a client's X-Request-Id kept (longer: a fresh id instead)
HEADER = b"x-request-id"


@dataclass
class RequestRecord:
    """One HTTP request, as its handler fills it in (None: not known, left out of the log line)."""

    request_id: str
    # time.monotonic() when the request arrived
    start: float = field(default_factory=time.monotonic)
    # the served model name the request used (or the first, if it named none)
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft: float | None = None  # seconds from `start` to the first generated token


def request_id(headers) -> str:
    """The client's X-Request-Id if it is 1 to MAX_REQUEST_ID visible ASCII characters, else a fresh
    one (what is echoed and logged is never arbitrary bytes)."""
    for name, value in headers:
        if name == HEADER:
            if 0 < len(value) <= MAX_REQUEST_ID and all(0x21 <= b <= 0x7E for b in value):
                return value.decode("ascii")
            break
    return uuid.uuid4().hex


class RequestMiddleware:
    """X-Request-Id in and out, the RequestRecord in the scope, the line when the response ends."""

    def __init__(self, app, log_requests: bool = True):
        self.app, self.log_requests = app, log_requests

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        record = RequestRecord(request_id(scope["headers"]))
        state = scope.setdefault("state", {})
        state["request_id"], state["rlt"] = record.request_id, record
        echo = (HEADER, record.request_id.encode("ascii"))
        status, ended = None, False

        async def send_with_id(message):
            nonlocal status, ended
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), echo]}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            status = status or 500  # (Starlette answered 500, or nothing went out)
            raise
        finally:
            self._log(scope, record, status, ended)

    def _log(self, scope, record: RequestRecord, status: int | None, ended: bool) -> None:
        level = logging.WARNING if status is None or status >= 500 else logging.INFO
        if level == logging.INFO and not self.log_requests:
            return
        # (no control characters)
        path = clip(scope["path"].encode("unicode_escape").decode("ascii"), 200)
        parts = [scope["method"], path, str(status or "-"), f"request_id={record.request_id}"]
        for name in ("prompt_tokens", "completion_tokens"):
            if (v := getattr(record, name)) is not None:
                parts.append(f"{name}={v}")
        if record.ttft is not None:
            parts.append(f"ttft={record.ttft:.3f}s")
        parts.append(f"e2e={time.monotonic() - record.start:.3f}s")
        if not ended:  # the client went away, or the server failed, before the response's end
            parts.append("unfinished")
        log.log(level, "%s", " ".join(parts))


def install(app, options: ServerOptions) -> None:
    """CORS (if any origin is allowed) around what is installed so far; then, outermost, the request
    middleware around Starlette's whole stack."""
    if options.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=options.allowed_origins,
            allow_methods=options.allowed_methods,
            allow_headers=options.allowed_headers,
            allow_credentials=options.allow_credentials,
            expose_headers=["X-Request-Id"],  # (a page's script may read it)
        )
    build = app.build_middleware_stack
    app.build_middleware_stack = lambda: RequestMiddleware(build(), options.log_requests)
