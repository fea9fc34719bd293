"""Load and faults, as a busy or hostile client brings them: thousands of requests at once through the
Python API and through `rlt serve`, a call of thousands of prompts, disconnect storms, SIGTERM under
load. Every request completes, fails with an error, or is refused at once; none is lost, and the
counts agree with the server's own counters. Bounded in count and time, on 127.0.0.1 only."""

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import rlt
from rlt import EngineOverloadedError, SamplingParams
from tests.helpers import FAST_ARGS
from tests.processes import processes_mentioning, rlt_processes_of, workers_of
from tests.serve.helpers import drain, free_port, scrape

HANG_GUARD_S = 300  # a test that hangs fails here instead of holding CI (not a speed bound)


# ---- the Python API ------------------------------------------------------------------------------
async def _run(engine, prompt, sp):
    try:
        async for out in engine.generate(prompt, sp):
            pass
        return out
    except EngineOverloadedError:
        return "refused"


async def test_thousands_at_once_all_finish_or_are_refused(checkpoints):
    """3,000 requests submitted in one go (more than the workers' ZeroMQ queues hold: nothing is
    dropped), against a queue of 500: the workers' share plus 500 run, the rest are refused at the
    call; then 3,000 against the default queue, which holds them all. Every request that ran got
    exactly its tokens, and the engine is empty after."""
    sp = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    for options, ran in (
        (dict(max_queued_requests=500, max_num_seqs=32), 2 * 32 + 500),
        ({}, 3000),
    ):
        async with rlt.Engine.launch(checkpoints["ouro"], **options) as engine:
            outs = await asyncio.wait_for(
                asyncio.gather(*(_run(engine, [5 + i % 40, 6, 7], sp) for i in range(3000))),
                HANG_GUARD_S,
            )
            done = [o for o in outs if o != "refused"]
            assert len(done) == ran  # (the worker holds 2 x max_num_seqs, the queue the rest)
            assert all(o.finish_reason == "length" and len(o.token_ids) == 3 for o in done)
            st = engine.stats()
            assert (st.live_requests, st.queued_requests, st.pending_cleanup) == (0, 0, 0)
            assert st.workers[0].credit_slots == 0


async def test_queued_requests_go_by_priority_and_abort_at_once(checkpoints):
    """Past the workers' share, requests wait in the coordinator: the lowest priority value first,
    then first come; one aborted while queued never reaches a worker."""
    sp = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    async with rlt.Engine.launch(checkpoints["ouro"], max_num_seqs=1) as engine:
        hold = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
        blockers = [engine.generate([9, 9, 9], hold) for _ in range(2)]  # the worker's share: 2 x 1
        order: list[str] = []

        async def one(rid, priority):
            async for out in engine.generate([5, 6, 7], sp, request_id=rid, priority=priority):
                pass
            order.append((rid, out.finish_reason))

        tasks = [asyncio.ensure_future(one(f"p{p}-{i}", p)) for i, p in enumerate([3, 1, 2, 1])]
        await asyncio.sleep(0)
        assert (
            engine.stats().queued_requests == 4 and engine.request_phase("p3-0").value == "queued"
        )
        assert await engine.abort("p2-2")
        assert engine.stats().queued_requests == 3
        for b in blockers:
            await b.aclose()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), HANG_GUARD_S)
        assert order == [
            ("p2-2", "abort"),
            ("p1-1", "length"),
            ("p1-3", "length"),
            ("p3-0", "length"),
        ]
        assert engine.stats().workers[0].credit_slots == 0


async def test_abort_storm_of_thousands_frees_everything(checkpoints):
    """3,000 streams closed at once (more aborts than a worker's queue holds): every one is aborted,
    every slot and block comes back, and the engine serves exactly afterwards."""
    long = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
    sp = SamplingParams(max_tokens=4, temperature=0)
    async with rlt.Engine.launch(checkpoints["ouro"]) as engine:
        async for expected in engine.generate([11, 12, 13], sp):
            pass
        streams = [engine.generate([5 + i % 40, 6], long) for i in range(3000)]
        await asyncio.sleep(0.5)
        await asyncio.gather(*(s.aclose() for s in streams))
        deadline = time.monotonic() + HANG_GUARD_S
        while (w := engine.stats().workers[0]).running or w.waiting or w.credit_slots:
            assert time.monotonic() < deadline, w
            await asyncio.sleep(0.05)
        assert w.kv_blocks_free == w.kv_blocks_total  # (cached prefixes count as free)
        async for again in engine.generate([11, 12, 13], sp):
            pass
        assert again.token_ids == expected.token_ids


# ---- rlt serve -----------------------------------------------------------------------------------
class Server:
    """`rlt serve` in its own temp dir (to see what it leaves behind), until its ready line."""

    def __init__(self, model: str, tmp_path, *flags: str):
        self.port, self.tmp = free_port(), str(tmp_path)
        env = {**os.environ, "TMPDIR": self.tmp}
        argv = [
            sys.executable,
            "-m",
            "rlt",
            "serve",
            model,
            "--port",
            str(self.port),
            *FAST_ARGS,
            *flags,
        ]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.url = f"http://127.0.0.1:{self.port}/v1"
        deadline, lines = time.monotonic() + 90, []
        while "ready at" not in (line := self.proc.stdout.readline()):
            lines.append(line)
            assert line and time.monotonic() < deadline, "".join(lines)
        self.lines: list[str] = []
        self.reader = drain(self.proc, self.lines)

    def output(self) -> str:
        """What it wrote after its ready line, once it has exited."""
        self.reader.join(HANG_GUARD_S)
        return "".join(self.lines)

    def leftovers(self) -> tuple[list[str], list[int]]:
        """The server's temp dirs and worker processes still there."""
        dirs = [d for d in os.listdir(self.tmp) if d.startswith("rlt-")]
        return dirs, processes_mentioning(self.tmp) + rlt_processes_of(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def server(checkpoints, tmp_path):
    servers = []

    def start(*flags):
        servers.append(Server(checkpoints["ouro"], tmp_path, *flags))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


async def http(port: int, path: str, body: dict | None = None, leave_after: float | None = None):
    """One request on its own connection: (status, headers, body); with leave_after, the client
    closes the socket after that many seconds instead of reading (a disconnect)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode() if body is not None else b""
    method = "POST" if body is not None else "GET"
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nConnection: close\r\n"
    writer.write(head.encode() + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    try:
        if leave_after is not None:
            await asyncio.sleep(leave_after)
            return None
        raw = await reader.read()
    finally:
        writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, payload


async def test_five_thousand_concurrent_requests_and_calls_of_thousands_of_prompts(server):
    """5,000 requests on 5,000 connections at once: each is answered (200 with its tokens) or refused
    at once (503 in OpenAI's shape, with Retry-After: the connection cap or the engine's queue); the
    answered count equals the server's own count of finished requests. Then one call of 3,000
    prompts: 3,000 choices, each with its tokens; and a call of 5,000, more than the engine queues:
    refused whole, the prompts admitted before the refusal aborted."""
    s = server("--max-prompts", "8000")
    before = scrape(s.url)
    body = {"max_tokens": 2, "temperature": 0, "ignore_eos": True}
    results = await asyncio.wait_for(
        asyncio.gather(
            *(
                http(s.port, "/v1/completions", body | {"prompt": [5 + i % 40, 6, 7]})
                for i in range(5000)
            )
        ),
        HANG_GUARD_S,
    )
    statuses = collections.Counter(r[0] for r in results)
    assert set(statuses) <= {200, 503} and statuses[200] >= 4096, statuses
    for status, headers, payload in results:
        if status == 200:
            assert json.loads(payload)["usage"]["completion_tokens"] == 2
        else:
            assert headers["retry-after"] == "1" and json.loads(payload)["error"]["code"] == 503
    length = 'rlt:request_success_total{finished_reason="length"}'
    assert scrape(s.url)[length] - before.get(length, 0) == statuses[200]

    prompts = [[5 + i % 40, 6, 7 + i % 3] for i in range(5000)]
    status, _, payload = await asyncio.wait_for(
        http(s.port, "/v1/completions", body | {"prompt": prompts[:3000]}), HANG_GUARD_S
    )
    assert status == 200, payload[:300]
    r = json.loads(payload)
    assert sorted(c["index"] for c in r["choices"]) == list(range(3000))
    assert r["usage"]["completion_tokens"] == 6000 and r["usage"]["prompt_tokens"] == 9000

    status, headers, payload = await asyncio.wait_for(
        http(s.port, "/v1/completions", body | {"prompt": prompts}), HANG_GUARD_S
    )
    assert status == 503 and headers["retry-after"] == "1", payload[:300]
    assert "max_queued_requests (4096)" in json.loads(payload)["error"]["message"]
    deadline = time.monotonic() + HANG_GUARD_S
    while (m := scrape(s.url))["rlt:num_requests_running"] or m["rlt:num_requests_waiting"]:
        assert time.monotonic() < deadline, m
        await asyncio.sleep(0.1)
    # (none of the refused call's ran on)
    assert m[length] - before.get(length, 0) == statuses[200] + 3000


async def test_disconnect_storms_abort_every_request(server):
    """Hundreds of clients that leave, streaming or not, with n = 2 or several prompts: every request
    and every child is aborted (nothing left running, every block free), and the server serves on."""
    s = server()
    before = scrape(s.url)
    long = {"max_tokens": 5000, "temperature": 0, "ignore_eos": True}
    calls = []
    for i in range(200):
        body = long | {"prompt": [5 + i % 40, 6], "stream": i % 2 == 0}
        if i % 4 == 1:
            body |= {"n": 2}
        elif i % 4 == 3:
            body |= {"prompt": [[5, 6], [7, 8, 9]]}
        calls.append(http(s.port, "/v1/completions", body, leave_after=1.0))
    await asyncio.wait_for(asyncio.gather(*calls), HANG_GUARD_S)
    deadline = time.monotonic() + HANG_GUARD_S
    while (m := scrape(s.url))["rlt:num_requests_running"] or m["rlt:num_requests_waiting"]:
        assert time.monotonic() < deadline, m
        await asyncio.sleep(0.1)
    aborted = m['rlt:request_success_total{finished_reason="abort"}'] - before.get(
        'rlt:request_success_total{finished_reason="abort"}', 0
    )
    assert aborted == 200 + 50 + 50  # one per request, one more for each n=2 and two-prompt call
    assert m["rlt:kv_cache_usage_perc"] == 0
    status, _, payload = await http(s.port, "/v1/completions", {"prompt": [5, 6], "max_tokens": 2})
    assert status == 200 and json.loads(payload)["usage"]["completion_tokens"] == 2


async def _stream_events(port: int, body: dict, events: list) -> None:
    """A streamed completion, each server-sent event's data appended to `events` as it arrives."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body | {"stream": True}).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    try:
        while line := await reader.readline():
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
    finally:
        writer.close()


async def _until(condition) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
async def test_sigterm_under_load_fails_what_is_left_after_the_deadline(server, sig):
    """SIGTERM (or SIGHUP, SIGINT) with streams running: new connections are refused, the streams run on
    until --shutdown-timeout, then each ends with an error event; the server exits with no worker
    and no temp dir left."""
    s = server("--shutdown-timeout", "1.5")
    body = {"prompt": [5, 6, 7], "max_tokens": 50_000, "temperature": 0, "ignore_eos": True}
    events = [[] for _ in range(8)]
    tasks = [asyncio.ensure_future(_stream_events(s.port, body, ev)) for ev in events]
    await _until(lambda: all(events))
    s.proc.send_signal(sig)
    await asyncio.sleep(0.5)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", s.port)
    assert not any(t.done() for t in tasks)  # (inside the deadline: still streaming)
    await asyncio.wait_for(asyncio.gather(*tasks), HANG_GUARD_S)
    for ev in events:
        assert b'"error"' in ev[-2] and ev[-1] == b"[DONE]", ev[-3:]
    # (Ctrl-C: "rlt: interrupted")
    assert s.proc.wait(HANG_GUARD_S) == (130 if sig == signal.SIGINT else -sig)
    assert s.leftovers() == ([], [])


async def test_a_second_signal_stops_at_once(server):
    s = server("--shutdown-timeout", "600")
    body = {"prompt": [5, 6, 7], "max_tokens": 50_000, "temperature": 0, "ignore_eos": True}
    events: list = []
    task = asyncio.ensure_future(_stream_events(s.port, body, events))
    await _until(lambda: events)
    s.proc.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.5)
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(60)  # (not the 600 s deadline)
    await asyncio.wait_for(task, HANG_GUARD_S)
    assert s.leftovers() == ([], [])


def test_a_server_whose_worker_will_not_restart_exits_non_zero(server):
    """--no-restart and the only worker killed: the server does not stay up answering 503; it exits
    with status 1 and says why, leaving nothing behind."""
    s = server("--no-restart")
    (worker,) = workers_of(s.proc.pid)
    os.kill(worker, signal.SIGKILL)
    assert s.proc.wait(HANG_GUARD_S) == 1
    out = s.output()
    assert "the engine cannot serve any more" in out and "was killed by SIGKILL" in out
    assert s.leftovers() == ([], [])
