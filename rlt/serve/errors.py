"""Every HTTP error in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: the
server's own (HTTPError), Starlette's 404 / 405, FastAPI's 422, and any unhandled exception (a
generic 500; the traceback goes to the log only). Messages are bounded: what a request echoes is
cut short, and a 503 or 500 tells the client a generic reason (engine errors carry pids and log
text: those are logged here, at warning level, not sent)."""

import logging
import reprlib

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from rlt.errors import EngineDeadError

log = logging.getLogger("rlt.serve")

MAX_MESSAGE = 400  # characters of an error message a client gets
UNAVAILABLE = "no worker is ready: a worker died and is restarting, or the server is shutting down"
_KINDS = {
    401: "authentication_error",
    404: "not_found_error",
    408: "timeout_error",
    503: "service_unavailable",
}
_KINDS |= dict.fromkeys((400, 405, 413, 422), "invalid_request_error")

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxlist, _repr.maxdict, _repr.maxstring, _repr.maxlong, _repr.maxother = (
    3,
    6,
    4,
    60,
    40,
    60,
)


def clip(text: str, n: int = 100) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def short(value) -> str:
    """A bounded repr of what a request sent (a deep, long or huge value cut short with '…')."""
    try:
        return clip(_repr.repr(value))
    except Exception:  # noqa: BLE001 - e.g. an int past Python's digit limit
        return f"<{type(value).__name__}>"


class HTTPError(Exception):
    """status, message, OpenAI's error type (default: by status), the field at fault; a 503's message
    is logged and the client gets UNAVAILABLE unless `public` (a message of the server's own)."""

    def __init__(
        self, status: int, message: str, kind=None, param=None, headers=None, public=False
    ):
        self.status, self.message, self.param, self.headers, self.public = (
            status,
            message,
            param,
            headers,
            public,
        )
        self.kind = kind or _KINDS.get(status, "internal_error")


def body(message: str, kind: str, code: int, param: str | None = None) -> dict:
    return {
        "error": {"message": clip(message, MAX_MESSAGE), "type": kind, "param": param, "code": code}
    }


def response(e: HTTPError) -> JSONResponse:
    message, headers = e.message, dict(e.headers or {})
    if e.status == 503:
        headers = {"Retry-After": "1"} | headers
        # engine texts name pids and logs: the client gets the reason, the log the text
        if not e.public:
            log.warning("503: %s", message)
            message = UNAVAILABLE
    # the rest of the body is not read: the connection cannot carry another request
    if e.status in (408, 413):
        headers["Connection"] = "close"
    return JSONResponse(
        body(message, e.kind, e.status, e.param), status_code=e.status, headers=headers
    )


def in_stream(e: Exception) -> dict:
    """The error event of a stream that failed after it started (a worker died: 503; else 500)."""
    if isinstance(e, EngineDeadError):
        log.warning("a stream failed: %s", e)
        return body(UNAVAILABLE, "service_unavailable", 503)
    log.error("a stream failed", exc_info=e)
    return body("internal server error", "internal_error", 500)


def install(app: FastAPI) -> None:
    """The handlers that put every error response of `app` in OpenAI's shape."""

    @app.exception_handler(HTTPError)
    async def _own(_, e: HTTPError):
        return response(e)

    @app.exception_handler(HTTPException)
    async def _starlette(request, e: HTTPException):
        if e.status_code == 404:
            message = f"Invalid URL ({request.method} {clip(request.url.path)})"
        elif e.status_code == 405:
            message = f"method {request.method} is not allowed here"
        else:
            message = str(e.detail)
        return response(HTTPError(e.status_code, message, headers=e.headers))

    @app.exception_handler(RequestValidationError)
    async def _validation(_, e: RequestValidationError):
        return response(HTTPError(422, short(e.errors())))

    @app.exception_handler(Exception)
    async def _unhandled(_, e: Exception):  # (Starlette logs the traceback after this answer)
        return response(HTTPError(500, "internal server error"))
