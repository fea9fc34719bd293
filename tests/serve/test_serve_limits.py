"""`rlt serve`'s HTTP bounds against one real server (small limits given as flags): every error in
OpenAI's shape naming the field with a bounded message, strict JSON types, body size (413) and body
time (408), header timeout, the connection cap's JSON 503, the API key's scheme in any case, huge
prompts refused while other streams flow, and generic 500 / 503 messages."""

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import openai
import pytest

from tests.processes import processes_mentioning, workers_of
from tests.serve.helpers import KEY, address, openai_error, request, serving

LIMITS = ["--max-body-bytes", str(8 << 20), "--body-timeout", "2", "--header-timeout", "1"]
LIMITS += ["--max-connections", "8", "--max-prompts", "8"]


@pytest.fixture(scope="module")
def server(checkpoints):
    """(base URL, max positions) of a server with the LIMITS above."""
    with open(os.path.join(checkpoints["ouro"], "config.json")) as f:
        max_positions = json.load(f)["max_position_embeddings"]
    with serving(checkpoints["ouro"], "--api-key", KEY, *LIMITS) as url:
        yield url, max_positions  # (the ready line comes once the port listens)


def raw_response(sock: socket.socket) -> tuple[int, dict, bytes]:
    r = http.client.HTTPResponse(sock)
    r.begin()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()


def test_past_the_connection_cap_a_request_gets_a_json_503(server):
    """8 connections are served; the 9th gets a 503 in OpenAI's shape with Retry-After and is closed.
    (First in this file: no connection of another test is open.)"""
    url, _ = server
    socks = []
    try:
        for i in range(9):
            s = socket.create_connection(address(url), timeout=30)
            socks.append(s)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = raw_response(s)
            if i < 8:
                assert status == 200, (i, body)
        assert status == 503 and headers["retry-after"] == "1" and headers["connection"] == "close"
        assert openai_error(json.loads(body), 503)["type"] == "service_unavailable"
        assert socks[-1].recv(1) == b""  # closed
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 10
    while request(url, "GET", "/health")[0] != 200:  # (the closed ones are let go)
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.parametrize(
    "limits, cap, soft", [((300, 2000), 2000 - 256, 2000), ((256, 256), 256 - 64, 256)]
)
def test_the_connection_cap_follows_the_open_file_limit(limits, cap, soft):
    """The soft open-file limit is raised to the hard one, and the cap lowered to what it allows
    (past it a flood would meet EMFILE instead of the cap's 503)."""
    code = (
        "import resource; from rlt.serve.connections import connection_cap; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, {limits}); "
        "print(connection_cap(4096), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == [str(cap), str(soft)]


def test_header_timeout_closes_silent_and_trickling_connections(server):
    url, _ = server
    for first in (b"", b"GET /health HTTP/1.1\r\nHost: x\r\n"):  # nothing; headers never finished
        with socket.create_connection(address(url), timeout=30) as s:
            t0 = time.monotonic()
            s.sendall(first)
            assert s.recv(1) == b"" and time.monotonic() - t0 >= 0.9
    # a kept-alive connection's next request
    with socket.create_connection(address(url), timeout=30) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert raw_response(s)[0] == 200
        s.sendall(b"GET /hea")
        assert s.recv(1) == b""


def test_headers_past_64_kib_get_a_json_431_and_a_large_body_is_no_header(server):
    """httptools bounds no header: past 64 KiB the server answers 431 in OpenAI's shape."""
    url, _ = server
    with socket.create_connection(address(url), timeout=30) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (65 << 10))
        status, headers, payload = raw_response(s)
        assert status == 431 and headers["content-type"] == "application/json"
        openai_error(json.loads(payload), 431)
    # 300 KB in the headers' read
    body = json.dumps({"prompt": [5] * 100_000, "max_tokens": 1}).encode()
    with socket.create_connection(address(url), timeout=30) as s:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        s.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        # (its body arrives with its headers: it is read as a body)
        status, _, payload = raw_response(s)
        assert (
            status == 400
            and "max positions" in openai_error(json.loads(payload), 400, "prompt")["message"]
        )


def test_body_size_and_time_limits(server):
    url, _ = server
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + KEY.encode()
        + b"\r\n"
    )
    # too big by Content-Length: not read
    with socket.create_connection(address(url), timeout=30) as s:
        s.sendall(head + b"Content-Length: 104857600\r\n\r\n")
        status, headers, body = raw_response(s)
        assert status == 413 and headers["connection"] == "close"
        assert "8388608" in openai_error(json.loads(body), 413)["message"]
    # chunked: refused once past the limit
    with socket.create_connection(address(url), timeout=30) as s:
        s.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n" % (1 << 20) + b" " * (1 << 20) + b"\r\n"
        s.sendall(chunk * 8 + b"1\r\n \r\n")  # one byte past it (all of it read: no reset)
        status, _, body = raw_response(s)
        assert status == 413 and openai_error(json.loads(body), 413)
    # uploading past it: reads the 413
    with openai.OpenAI(base_url=url, api_key=KEY, max_retries=0) as client:
        with pytest.raises(openai.APIStatusError) as e:
            client.completions.create(model="m", prompt="x" * (9 << 20))
        assert e.value.status_code == 413 and "8388608" in e.value.message
    with socket.create_connection(address(url), timeout=30) as s:  # a body that stops coming
        t0 = time.monotonic()
        s.sendall(head + b'Content-Length: 100\r\n\r\n{"prompt": ')
        status, headers, body = raw_response(s)
        assert status == 408 and headers["connection"] == "close" and time.monotonic() - t0 >= 1.9
        assert openai_error(json.loads(body), 408)["type"] == "timeout_error"


def test_errors_in_openai_shape_name_the_field(server):
    url, max_positions = server
    ok, user = {"prompt": "The river", "max_tokens": 1}, [{"role": "user", "content": "x"}]
    deep = b'{"prompt": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    cases = [  # (path, body, status, param)
        ("/v1/completions", ok | {"stream": "false"}, 400, "stream"),
        ("/v1/completions", ok | {"ignore_eos": "false"}, 400, "ignore_eos"),
        ("/v1/completions", ok | {"return_exit_depths": 1}, 400, "return_exit_depths"),
        ("/v1/completions", ok | {"return_token_ids": "true"}, 400, "return_token_ids"),
        (
            "/v1/completions",
            ok | {"stream_options": {"include_usage": "no"}},
            400,
            "stream_options.include_usage",
        ),
        ("/v1/completions", ok | {"temperature": 10**400}, 400, "temperature"),
        ("/v1/completions", ok | {"top_p": [[[[[[0.5]]]]]]}, 400, "top_p"),
        ("/v1/completions", ok | {"seed": "abc", "n": 2}, 400, "seed"),
        ("/v1/completions", ok | {"seed": 2**70}, 400, "seed"),
        ("/v1/completions", ok | {"stop": ["x" * 10_000] * 17}, 400, "stop"),
        ("/v1/completions", deep, 400, None),
        ("/v1/completions", b'{"prompt": "x", "temperature": 1e999}', 400, None),
        ("/v1/completions", ok | {"prompt": ["a"] * 9}, 400, "prompt"),  # past --max-prompts 8
        ("/v1/completions", ok | {"prompt": ["a"] * 3, "n": 3}, 400, "prompt"),  # 3 x n 3 children
        ("/v1/completions", ok | {"prompt": [1] * (max_positions + 1)}, 400, "prompt"),
        ("/v1/completions", ok | {"prompt": [1, 2, "x" * 10_000]}, 400, "prompt"),
        ("/v1/completions", ok | {"model": "x" * 10_000}, 404, "model"),
        ("/v1/chat/completions", {"messages": user, "logprobs": "true"}, 400, "logprobs"),
        ("/v1/chat/completions", {"messages": user * (max_positions + 1)}, 400, "messages"),
        ("/v1/chat/completions", {"messages": "x" * 10_000}, 400, "messages"),
        (
            "/v1/completions",
            ok | {"n": None, "temperature": None, "stream": None, "seed": None},
            200,
            None,
        ),
    ]
    for path, body, status, param in cases:
        got, _, answer = request(url, "POST", path, body)
        assert got == status, (path, str(body)[:200], answer)
        if status != 200:
            e = openai_error(answer, status, param)
            assert len(e["message"]) < 250 and "x" * 65 not in e["message"]
    assert (
        "limit 8"
        in request(url, "POST", "/v1/completions", ok | {"prompt": ["a"] * 9})[2]["error"][
            "message"
        ]
    )
    with socket.create_connection(address(url), timeout=30) as s:  # not HTTP at all
        s.sendall(b"HELLO THERE\r\n\r\n")
        status, _, body = raw_response(s)
        assert status == 400 and openai_error(json.loads(body), 400)
    status, _, body = request(url, "GET", "/v1/no-such-route")
    assert (
        status == 404
        and openai_error(body, 404)["message"] == "Invalid URL (GET /v1/no-such-route)"
    )
    status, _, body = request(url, "GET", "/v1/completions")
    assert status == 405 and openai_error(body, 405)
    status, _, body = request(
        url, "POST", "/v1/completions", ok, headers={"Authorization": "Bearer wrong"}
    )
    assert status == 401 and openai_error(body, 401)["type"] == "authentication_error"
    assert request(url, "GET", "/v1/models", headers={"Authorization": f"bearer {KEY}"})[0] == 200
    for method, path, body in (
        ("POST", "/tokenize", {"prompt": "a"}),
        ("GET", "/metrics", None),
        ("GET", "/version", None),
    ):
        # (every route but /health)
        assert request(url, method, path, body, headers={})[0] == 401, path
    assert request(url, "GET", "/health", headers={})[0] == 200
    with openai.OpenAI(base_url=url, api_key=KEY, max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="m", prompt=["a"] * 5, n=2)
        assert e.value.body["param"] == "prompt"
        with pytest.raises(openai.AuthenticationError):
            client.with_options(api_key="wrong").models.list()


async def test_huge_prompts_are_refused_while_a_stream_flows(server):
    """A 5 MB text is refused before it is tokenized; a 2 MB one (within the characters bound) is
    tokenized off the event loop, then refused: a stream running meanwhile keeps getting chunks."""
    url, _ = server
    async with openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0) as client:
        stream = await client.completions.create(
            model="m",
            prompt="The river",
            max_tokens=20000,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        stamps = []

        async def read():
            async for _ in stream:
                stamps.append(time.monotonic())

        reader = asyncio.ensure_future(read())
        try:
            while not stamps:
                await asyncio.sleep(0.01)
            huge = {"prompt": "x" * 5_000_000, "max_tokens": 1}
            status, _, body = await asyncio.to_thread(request, url, "POST", "/v1/completions", huge)
            assert status == 400 and "characters" in openai_error(body, 400, "prompt")["message"]
            big = {"prompt": ("hello world " * 200_000)[:2_000_000], "max_tokens": 1}
            t0 = time.monotonic()
            status, _, body = await asyncio.to_thread(request, url, "POST", "/v1/completions", big)
            t1 = time.monotonic()
            assert (
                status == 400
                and "tokens, more than" in openai_error(body, 400, "prompt")["message"]
            )
            deadline = time.monotonic() + 60  # (a chunk after it, however busy the machine)
            while stamps[-1] <= t1:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
        finally:
            reader.cancel()
            await stream.close()
    during = [t for t in stamps if t0 <= t <= t1]
    around = [max(t for t in stamps if t < t0), *during, min(t for t in stamps if t > t1)]
    gap = max(b - a for a, b in zip(around, around[1:]))
    assert len(during) >= 2 and gap < max(1.0, (t1 - t0) / 2), (gap, t1 - t0, len(during))


def test_500_and_stream_errors_are_generic():
    """An unhandled exception: a 500 in OpenAI's shape, no text of it; a stream's failure likewise."""
    from starlette.testclient import TestClient

    from rlt.errors import EngineDeadError
    from rlt.serve.app import build_app
    from rlt.serve.errors import UNAVAILABLE, in_stream

    app = build_app(None, "m", None, {})

    @app.get("/boom")
    async def boom():
        raise RuntimeError("worker (pid 123) wrote /tmp/secret.log")

    r = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert (
        r.status_code == 500 and openai_error(r.json(), 500)["message"] == "internal server error"
    )
    dead = in_stream(EngineDeadError("unified worker 0 (pid 123) died: see /tmp/rlt/log"))
    assert (
        openai_error(dead, 503)["message"] == UNAVAILABLE
        and "pid" not in UNAVAILABLE
        and "/" not in UNAVAILABLE
    )
    assert openai_error(in_stream(KeyError("/x pid 5")), 500)["message"] == "internal server error"


def test_a_dead_worker_is_a_generic_503(server):
    """(Last: the worker restarts.) Its 503 names no pid or path and says when to retry; /health is
    503 until the worker is back, then 200. (/health is asked without pause from a thread: a CPU
    worker restarts in tens of milliseconds.)"""
    url, _ = server
    port = address(url)[1]
    [server_pid] = processes_mentioning(f"--port {port} ")
    workers = workers_of(server_pid)
    assert workers
    health, done = set(), threading.Event()

    def ask_health():
        while not done.is_set():
            health.add(request(url, "GET", "/health")[0])

    asking = threading.Thread(target=ask_health)
    asking.start()
    try:
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        deadline, seen = time.monotonic() + 30, None
        while True:
            status, headers, body = request(
                url, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1}
            )
            if status == 503:
                seen = seen or (headers, body)
            elif status == 200 and seen:
                break
            assert time.monotonic() < deadline, (status, body)
            time.sleep(0.01)
    finally:
        done.set()
        asking.join()
    headers, body = seen
    message = openai_error(body, 503)["message"]
    assert headers["retry-after"] == "1" and "pid" not in message and "/" not in message
    assert 503 in health and request(url, "GET", "/health")[0] == 200
