"""Bounds on what one request may ask of the server, checked before the work they bound: body bytes
(413, from Content-Length before reading, and while reading), the time the body may take (408),
JSON nesting, prompts per call, messages per chat, and a prompt's length before it is tokenized.
Tokenizing and chat-template rendering run in a small thread pool, off the event loop: one huge
request never stalls the other streams (the tokenizer releases the GIL; a template yields it)."""

import asyncio
import concurrent.futures
import os
import sys
import threading

import msgspec
from starlette.requests import ClientDisconnect, Request

from rlt.errors import RequestError
from rlt.serve.errors import HTTPError, clip, short
from rlt.serve.flags import Limits

DRAIN_BYTES = 64 << 20  # a refused body up to this size is read before the 413 (read_body)
# a text prompt longer than this many characters per position cannot fit (tokens
CHARS_PER_POSITION = 32
# average ~4 characters; a single token covers at most a few dozen): refused before tokenizing it


async def read_body(request: Request, limits: Limits) -> bytes:
    """The body, at most max_body_bytes of it (413), within body_timeout seconds (408). A refused
    body of up to DRAIN_BYTES is read to its end and dropped first (nginx's lingering close): a client
    still uploading then reads the 413 instead of a connection reset."""
    limit = limits.max_body_bytes
    length = request.headers.get("content-length", "")
    # (int() of 5,000 digits raises)
    if length.isdigit() and (len(length) > 18 or int(length) > limit):
        if len(length) <= 18 and int(length) <= DRAIN_BYTES:
            await _drain(request, 0, limits.body_timeout)
        raise HTTPError(
            413, f"the request body has {clip(length, 20)} bytes, more than the limit {limit}"
        )
    chunks, size = [], 0
    try:
        async with asyncio.timeout(limits.body_timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    break
                chunks.append(chunk)
    except TimeoutError:
        raise HTTPError(
            408, f"the request body did not arrive within {limits.body_timeout:g} s"
        ) from None
    except ClientDisconnect:  # nobody reads the answer
        raise HTTPError(400, "the client disconnected before sending the whole body") from None
    if size > limit:
        await _drain(request, size, limits.body_timeout)
        raise HTTPError(413, f"the request body is longer than the limit of {limit} bytes")
    return b"".join(chunks)


async def _drain(request: Request, size: int, seconds: float) -> None:
    """Read and drop the rest of a refused body, up to DRAIN_BYTES in all, for at most `seconds` (at
    most 5: nginx's lingering_timeout)."""
    try:
        async with asyncio.timeout(min(seconds, 5.0)):
            async for chunk in request.stream():
                size += len(chunk)
                if size > DRAIN_BYTES:
                    return
    except (TimeoutError, ClientDisconnect):
        pass


def decode(raw: bytes) -> dict:
    """The body as a JSON object, decoded on the loop: msgspec holds the GIL, so a thread would not
    help; the body limit bounds it. Measured at the 4 MiB default (2-core CI machine): a text prompt
    ~1 ms, token ids ~20-25 ms, the worst case (nothing but empty arrays or objects) ~80 ms, more
    while the GC runs. (16 MiB would be ~0.1 s for plain token ids, ~0.4-1.3 s for that worst case.)"""
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:  # (a number past float or int64 range is one too)
        raise HTTPError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:  # msgspec stops at Python's recursion limit
        raise HTTPError(400, "the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    return body


def check_prompts(prompts, n: int, max_positions: int, limits: Limits) -> list:
    """/v1/completions' prompt: a text, token ids, or a list of either; at most max_prompts children
    (prompts x n), each no longer than the model could take (checked before tokenizing)."""
    if isinstance(prompts, str) or (
        isinstance(prompts, list) and prompts and type(prompts[0]) is int
    ):
        prompts = [prompts]
    if not isinstance(prompts, list) or not prompts:
        raise RequestError("prompt must be a string, token ids, or a non-empty list of them")
    if len(prompts) * n > limits.max_prompts:
        raise RequestError(
            f"prompt has {len(prompts)} prompts x n {n} = {len(prompts) * n} choices, more than the limit "
            f"{limits.max_prompts}"
        )
    for p in prompts:
        if isinstance(p, str):
            check_text(p, "prompt", max_positions)
        elif not isinstance(p, list):
            raise RequestError(f"prompt must be a string or a list of token ids, got {short(p)}")
        else:
            check_ids(p, "prompt", max_positions)
    return prompts


def check_text(text: str, field: str, max_positions: int) -> None:
    if len(text) > CHARS_PER_POSITION * max_positions:
        raise RequestError(
            f"{field} has {len(text)} characters: more than {CHARS_PER_POSITION} per position of the model's "
            f"max positions {max_positions} cannot fit"
        )


def token_ids(engine, prompt, add_special_tokens: bool = True) -> list[int]:
    """A checked prompt's token ids (in the pool: tokenizing a long text takes a while)."""
    if isinstance(prompt, str) and engine.tokenizer is None:
        raise RequestError("prompt must be token ids: this model has no tokenizer")
    # (the engine's message echoes it)
    if isinstance(prompt, list) and not all(type(t) is int for t in prompt):
        bad = next(t for t in prompt if type(t) is not int)
        raise RequestError(f"prompt token ids must be integers, got {short(bad)}")
    ids = engine.tokenize(prompt, add_special_tokens)
    check_ids(ids, "prompt", engine.model_config.max_positions)
    return ids


def check_ids(ids: list, field: str, max_positions: int) -> None:
    """(Here, not by the engine at admission: it would check each of the ids on the loop first.)"""
    if len(ids) > max_positions:
        raise RequestError(
            f"{field} has {len(ids)} tokens, more than the model's max positions {max_positions}"
        )


class Pool:
    """The thread pool tokenizing prompts and rendering chats (a few threads: each holds a core), and
    two threads at nice 10 checking grammars' structure: a large schema's is tens of milliseconds of
    C++ (xgrammar releases the GIL), which would otherwise take the cores from the worker's passes and
    this loop while a burst of them arrives."""

    def __init__(self):
        workers = min(4, os.cpu_count() or 1)
        self.executor = concurrent.futures.ThreadPoolExecutor(
            workers, thread_name_prefix="rlt-tokenize"
        )
        self.checks = concurrent.futures.ThreadPoolExecutor(
            2, "rlt-grammar-check", initializer=_nice
        )

    async def run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def check(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.checks, fn, *args)


def _nice() -> None:
    if sys.platform == "linux":  # (Linux: a thread's own niceness, not the process's)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
