"""The serving benchmark's HTTP side: a streamed completion from any OpenAI-compatible server.

A plain HTTP/1.1 client on asyncio streams (one connection per request, as a client that opens
one per user would) rather than a client library: the benchmark runs where only the standard
library is sure to be installed (the GPU machine has no registry), and parsing the event stream
by hand keeps the client's own cost per token small and visible.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class HTTPStatusError(RuntimeError):
    pass


async def post_events(url: str, body: dict, api_key: str | None = None) -> AsyncIterator[dict]:
    """POST `body` as JSON to `url` and yield each server-sent event's JSON until `data: [DONE]`.
    A status other than 200 raises HTTPStatusError with the server's answer."""
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
    try:
        payload = json.dumps(body).encode()
        head = [
            f"POST {u.path or '/'} HTTP/1.1",
            f"Host: {u.netloc}",
            "Content-Type: application/json",
            "Accept: text/event-stream",
            f"Content-Length: {len(payload)}",
            "Connection: close",
        ]
        if api_key:
            head.append(f"Authorization: Bearer {api_key}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        status, headers, chunked = await _head(reader)
        if status != 200:
            raise HTTPStatusError(f"HTTP {status}: {(await _body(reader, headers, chunked)).decode(errors='replace')}")
        buffer = b""
        async for piece in _pieces(reader, headers, chunked):
            buffer += piece
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                for line in event.splitlines():
                    if line.startswith(b"data:"):
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            return
                        yield json.loads(data)
    finally:
        writer.close()


async def _head(reader) -> tuple[int, dict, bool]:
    """The status, the headers (lower-case names) and whether the body comes in chunks."""
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, headers.get("transfer-encoding", "").lower() == "chunked"


async def _pieces(reader, headers: dict, chunked: bool) -> AsyncIterator[bytes]:
    if not chunked:
        n = headers.get("content-length")
        yield await (reader.readexactly(int(n)) if n is not None else reader.read())
        return
    while size := int((await reader.readline()).split(b";")[0], 16):
        yield await reader.readexactly(size)
        await reader.readline()  # the CRLF after each chunk


async def _body(reader, headers: dict, chunked: bool) -> bytes:
    return b"".join([p async for p in _pieces(reader, headers, chunked)])


async def get_json(url: str, api_key: str | None = None) -> dict:
    """GET `url` and its JSON answer (e.g. /v1/models)."""
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
    try:
        head = [f"GET {u.path or '/'} HTTP/1.1", f"Host: {u.netloc}", "Connection: close"]
        if api_key:
            head.append(f"Authorization: Bearer {api_key}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        await writer.drain()
        status, headers, chunked = await _head(reader)
        body = await _body(reader, headers, chunked)
        if status != 200:
            raise HTTPStatusError(f"HTTP {status}: {body.decode(errors='replace')}")
        return json.loads(body)
    finally:
        writer.close()
