"""What uvicorn (0.54) leaves open on a connection, on its httptools protocol: a request's headers
must arrive within header_timeout seconds (from the connection's start, or from a kept-alive
request's first byte) or the connection is closed; and past max_connections open at once, a new
connection's request gets a JSON 503 with Retry-After (uvicorn's limit_concurrency answers plain
text) and the connection closes. Connections that came first are served. A request HTTP cannot
parse gets a JSON 400."""

import logging
import resource

import msgspec
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rlt.serve.errors import body

_BUSY = msgspec.json.encode(
    body("the server holds too many connections: retry later", "service_unavailable", 503)
)


async def _busy(scope, receive, send) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(_BUSY)).encode()),
    ]
    headers += [(b"retry-after", b"1"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": _BUSY})


# a request line and headers longer than this get a 431 (nginx's large buffers: 32 KiB)
MAX_HEADER_BYTES = 64 << 10
OVER_CAP_HEADER_TIMEOUT_S = 1.0
# files kept open for other than connections (worker sockets, logs): this, or a quarter of the limit
FD_RESERVE = 256
log = logging.getLogger("rlt")


def connection_cap(max_connections: int) -> int:
    """max_connections, within what the open-file limit allows: the soft limit is raised to the hard
    one first (up to 65,536, as vLLM does), so a flood meets the cap's 503, never EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    cap = min(max_connections, max(1, soft - min(FD_RESERVE, soft // 4)))
    if cap < max_connections:
        log.warning(
            "rlt serve: at most %d connections (open-file limit %d); raise `ulimit -n` for more",
            cap,
            soft,
        )
    return cap


def protocol(header_timeout: float, max_connections: int) -> type:
    """uvicorn.Config(http=...)'s protocol class with these bounds."""
    return type(
        "BoundedHttpToolsProtocol",
        (_Bounded,),
        {"header_timeout": header_timeout, "cap": max_connections},
    )


class _Bounded(HttpToolsProtocol):
    header_timeout: float
    cap: int

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.over_cap = len(self.connections) > self.cap  # (this one counted)
        self.header_timer = None
        self._arm()

    def _arm(self) -> None:
        # (past the cap, a silent connection holds a file for 1 s at most)
        if self.header_timer is None:
            timeout = (
                min(self.header_timeout, OVER_CAP_HEADER_TIMEOUT_S)
                if self.over_cap
                else self.header_timeout
            )
            self.header_timer = self.loop.call_later(timeout, self._headers_late)
            self.header_bytes, self.header_tail = 0, b""

    def data_received(self, data: bytes) -> None:
        if self.header_timer is not None:  # (armed: this request's headers are not complete yet)
            # (the blank line ending them may be split between reads)
            seen = self.header_tail + data
            end = seen.find(b"\r\n\r\n")
            self.header_bytes += len(data) if end < 0 else max(0, end + 4 - len(self.header_tail))
            self.header_tail = seen[-3:]
            if self.header_bytes > MAX_HEADER_BYTES:  # (httptools has no bound of its own)
                self._disarm()
                return self._send_json(
                    431, b"Request Header Fields Too Large", "the request's headers are too long"
                )
        super().data_received(data)

    def _disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _headers_late(self) -> None:
        self.header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        if self.over_cap:
            self.app = _busy
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    # what HTTP cannot parse: JSON too (uvicorn's is text)
    def send_400_response(self, msg: str) -> None:
        self._send_json(400, b"Bad Request", msg)

    def _send_json(self, status: int, reason: bytes, msg: str) -> None:
        content = msgspec.json.encode(body(msg, "invalid_request_error", status))
        head = [k + b": " + v + b"\r\n" for k, v in self.server_state.default_headers]
        head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(content)]
        status_line = b"HTTP/1.1 %d %s\r\n" % (status, reason)
        self.transport.write(status_line + b"".join(head) + b"connection: close\r\n\r\n" + content)
        self.transport.close()
