"""The serving benchmark's HTTP side: streamed completions from any OpenAI-compatible server.

A plain HTTP/1.1 client on asyncio streams, with keep-alive connections reused from request to
request as a client library's pool does (vLLM's benchmark uses aiohttp's), rather than a client
library: the benchmark runs where only the standard library is sure to be installed (the GPU
machine has no registry), and parsing the event stream by hand keeps the client's own cost per
token small and visible.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class HTTPStatusError(RuntimeError):
    pass


class Client:
    """Requests to one server; idle connections are kept for the next request."""

    def __init__(self, base_url: str, api_key: str | None = None):
        u = urlsplit(base_url)
        self.host, self.port, self.netloc, self.prefix = (
            u.hostname,
            u.port or 80,
            u.netloc,
            u.path.rstrip("/"),
        )
        self.api_key = api_key
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def _request(self, method: str, path: str, payload: bytes | None, accept: str):
        """Send a request on an idle connection (or a new one, also when the server closed the idle
        one) -> (reader, writer, status, headers, chunked)."""
        head = [
            f"{method} {self.prefix}{path} HTTP/1.1",
            f"Host: {self.netloc}",
            f"Accept: {accept}",
        ]
        if payload is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        if self.api_key:
            head.append(f"Authorization: Bearer {self.api_key}")
        message = ("\r\n".join(head) + "\r\n\r\n").encode() + (payload or b"")
        while True:
            reused = bool(self.idle)
            reader, writer = (
                self.idle.pop() if reused else await asyncio.open_connection(self.host, self.port)
            )
            try:
                writer.write(message)
                await writer.drain()
                status_line = await reader.readline()
            except ConnectionError:
                status_line = b""
            if status_line or not reused:
                break
            writer.close()  # the server closed it while idle: once more on another
        if not status_line:
            writer.close()
            raise ConnectionError(f"{self.netloc} closed the connection without an answer")
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        return (
            reader,
            writer,
            int(status_line.split()[1]),
            headers,
            headers.get("transfer-encoding") == "chunked",
        )

    def _done(self, reader, writer, headers: dict) -> None:
        """The response was read to its end: keep the connection unless the server ends it."""
        if headers.get("connection", "").lower() == "close" or reader.at_eof():
            writer.close()
        else:
            self.idle.append((reader, writer))

    async def post_events(self, path: str, body: dict) -> AsyncIterator[dict]:
        """POST `body` as JSON and yield each server-sent event's JSON until `data: [DONE]`. A status
        other than 200 raises HTTPStatusError with the server's answer."""
        reader, writer, status, headers, chunked = await self._request(
            "POST", path, json.dumps(body).encode(), "text/event-stream"
        )
        complete = False
        try:
            if status != 200:
                answer = b"".join([p async for p in _pieces(reader, headers, chunked)])
                complete = True
                raise HTTPStatusError(f"HTTP {status}: {answer.decode(errors='replace')}")
            buffer, done = b"", False
            async for piece in _pieces(reader, headers, chunked):  # to the body's end, past [DONE]
                buffer += piece
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    for line in event.splitlines():
                        if line.startswith(b"data:") and not done:
                            data = line[5:].strip()
                            if data == b"[DONE]":
                                done = True
                            else:
                                yield json.loads(data)
            complete = True
        finally:  # a consumer that stopped early leaves the rest unread: that connection goes
            if complete:
                self._done(reader, writer, headers)
            else:
                writer.close()

    async def get_json(self, path: str) -> dict:
        """GET and its JSON answer (e.g. /models)."""
        reader, writer, status, headers, chunked = await self._request(
            "GET", path, None, "application/json"
        )
        body = b"".join([p async for p in _pieces(reader, headers, chunked)])
        self._done(reader, writer, headers)
        if status != 200:
            raise HTTPStatusError(f"HTTP {status}: {body.decode(errors='replace')}")
        return json.loads(body)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def _pieces(reader, headers: dict, chunked: bool) -> AsyncIterator[bytes]:
    """The body as it arrives, to its end (chunked: through the last chunk and its trailer)."""
    if not chunked:
        n = headers.get("content-length")
        yield await (reader.readexactly(int(n)) if n is not None else reader.read())
        return
    while size := int((await reader.readline()).split(b";")[0], 16):
        yield await reader.readexactly(size)
        await reader.readline()  # the CRLF after each chunk
    while (await reader.readline()) not in (b"\r\n", b""):  # trailer lines, then the final CRLF
        pass
