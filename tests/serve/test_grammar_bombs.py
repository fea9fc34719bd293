"""Requests built to wedge structured output (issue 61), against `rlt serve` on the tiny Ouro: each
size limit is a 400 naming the field and the limit, before any worker work; grammars past the
limits' reach (a choice of 2,000 long strings, seconds to compile) are killed at the compile
deadline while a plain stream goes on and a small schema is answered about as quickly as without
them; the worker's memory comes back."""

import json
import os
import statistics
import threading
import time

import openai
import pytest

from rlt.contract.validation import resolve_params
from tests.processes import processes_mentioning, workers_of
from tests.serve.helpers import post, serving

SMALL = {
    "type": "object",
    "properties": {"a": {"type": "string", "maxLength": 4}},
    "required": ["a"],
}


def _small_schema_seconds(url: str) -> float:
    t0 = time.monotonic()
    status, answer = post(url, "/v1/completions", _schema_body(SMALL, max_tokens=24))
    assert status == 200, answer
    assert json.loads(answer["choices"][0]["text"])  # (strict)
    return time.monotonic() - t0


def _schema_body(schema: dict, **kw) -> dict:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    return {"prompt": "The river", "temperature": 1.0, "response_format": fmt} | kw


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * 4096


def _worker_pid(url: str) -> int:
    """The worker process of the server listening on url's port."""
    port = url.rsplit(":", 1)[1].split("/")[0]
    [server] = processes_mentioning(f"--port {port} ")
    [worker] = workers_of(server)
    return worker


@pytest.fixture(scope="module")
def bombed(checkpoints):
    output: list[str] = []
    with serving(checkpoints["ouro"], "--grammar-compile-timeout", "1", output=output) as url:
        yield url, output


def test_limits_are_400s_naming_the_field_and_the_limit(bombed):
    url = bombed[0]
    tools = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": SMALL}}
        for i in range(10_000)
    ]
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    cases = [
        (
            _schema_body({"enum": [f"v{i}" for i in range(5000)]}),
            "response_format: has 5000 enum and choice entries, more than the limit 2048 (max_grammar_entries)",
        ),
        (
            _schema_body({"enum": [f"v{i}" for i in range(100_000)]}),
            "response_format: has 988900 bytes, more than the limit 262144 (max_grammar_bytes)",
        ),
        (
            {"prompt": "x", "structured_outputs": {"regex": "a" * 5000}},
            "structured_outputs: has 5000 characters, more than the limit 4096 (max_regex_length)",
        ),
        (
            _schema_body({"type": "object", "description": "d" * (300 << 10)}),
            "response_format: has 307237 bytes, more than the limit 262144 (max_grammar_bytes)",
        ),
        (
            _schema_body(
                {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}}
            ),
            "response_format: $.properties.a.$ref 'https://example.com/s.json' is external",
        ),
        (
            chat | {"tools": tools, "tool_choice": "required"},
            "tools has 10000 entries, more than the limit 128",
        ),
        (
            chat | {"tools": tools[:2] + tools[:1]},
            "tools[2].function.name 'f0' is the name of an earlier tool",
        ),
        (
            chat | {"tools": [{"type": "function", "function": {"name": ""}}]},
            "tools[0] must be a function tool",
        ),
        (
            {"messages": [{"role": "user", "content": "hi", "colour": 1}]},
            "messages[0].'colour' is not a message",
        ),
    ]
    for body, start in cases:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        status, answer = post(url, path, body)
        assert status == 400 and answer["error"]["message"].startswith(start), (start, answer)


def test_chat_templates_are_bounded(bombed, ouro_server):
    """A request's own template is refused unless the server trusts them; a trusting server renders
    it under bounds: output past what the model could take, or a render past its time, is a 400."""
    hi = [{"role": "user", "content": "hi"}]
    status, answer = post(
        bombed[0], "/tokenize", {"messages": hi, "chat_template": "{{ messages }}"}
    )
    assert status == 400 and answer["error"]["message"].startswith(
        "chat_template: a request's own chat template is"
    )
    bombs = {
        "{{ 'a' * 300000000 }}": "the chat template's output would pass",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}": "took longer than",
        "{% set s = namespace(v='ab') %}{% for i in range(60) %}{% set s.v = s.v + s.v %}{% endfor %}": "would pass",
        "{{ 10 ** 100000 }}": "is too large",
    }
    for path in ("/tokenize", "/v1/chat/completions"):
        for template, why in bombs.items():
            body = {"messages": hi, "chat_template": template} | (
                {"max_tokens": 1} if path.startswith("/v1") else {}
            )
            status, answer = post(ouro_server, path, body)
            assert status == 400 and why in answer["error"]["message"], (template, answer)


def test_huginn_refuses_the_gate(checkpoints):
    from rlt.contract.sampling_params import SamplingParams
    from rlt.errors import RequestError
    from rlt.models.model_config import ModelConfig

    mc = ModelConfig.from_pretrained(checkpoints["huginn"])
    with pytest.raises(
        RequestError, match="exit_criterion 'gate' is Ouro's learned exit gate; this model"
    ):
        resolve_params(mc, 2, SamplingParams(exit_criterion="gate"))


def test_slow_grammars_wedge_nobody(bombed):
    """8 grammars of seconds each: killed at the 1 s deadline (400s naming it) while a plain stream
    goes on and a small schema is answered within 1 s of its usual time, during and after; the
    worker's RSS comes back within 10 %."""
    url, _ = bombed
    usual = statistics.median(_small_schema_seconds(url) for _ in range(3))
    pid = _worker_pid(url)
    rss = _rss(pid)
    client = openai.OpenAI(base_url=url, api_key="-", max_retries=0)
    arrivals, finish = [], []

    def stream():
        for chunk in client.completions.create(
            model="m",
            prompt="The river",
            max_tokens=400,
            stream=True,
            extra_body={"ignore_eos": True},
        ):
            arrivals.append(time.monotonic())
            finish.append(chunk.choices[0].finish_reason)

    answers = []

    def bomb(k: int):
        choice = [f"bomb {k} entry {i} " * 6 for i in range(2000)]
        answers.append(
            post(url, "/v1/completions", {"prompt": "x", "structured_outputs": {"choice": choice}})
        )

    plain = threading.Thread(target=stream)
    plain.start()
    while len(arrivals) < 20:
        time.sleep(0.01)
    bombs = [threading.Thread(target=bomb, args=(k,)) for k in range(8)]
    for b in bombs:
        b.start()
    during = [_small_schema_seconds(url) for _ in range(3)]
    for b in bombs:
        b.join()
    plain.join()
    after = [_small_schema_seconds(url) for _ in range(3)]
    assert [a[0] for a in answers] == [400] * 8, str(answers[0])[:600]
    assert all(
        "did not compile within 1 s (grammar_compile_timeout)" in a[1]["error"]["message"]
        for a in answers
    )
    # (its pace while the bombs arrive: issue 61's note has the gaps measured)
    assert finish[-1] == "length"
    assert max(during + after) <= usual + 1.0, (usual, during, after)
    assert _rss(pid) <= 1.1 * rss, (rss, _rss(pid))


async def test_health_says_when_a_worker_cannot_serve(checkpoints):
    """A stopped worker (SIGSTOP) is unhealthy within a few heartbeats, before the coordinator kills
    it, and healthy again once it runs (SIGCONT); the reason names it."""
    import asyncio
    import signal

    import rlt
    from rlt.errors import EngineDeadError

    async with rlt.Engine.launch(
        checkpoints["ouro"], heartbeat_interval=0.2, heartbeat_timeout=60.0, startup_timeout=60.0
    ) as engine:
        await engine.check_health()
        pid = engine.stats().workers[0].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            for _ in range(200):
                try:
                    await engine.check_health()
                except EngineDeadError as e:
                    assert "no unified worker can serve: unified0.0 sent no heartbeat for" in str(e)
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("healthy while stopped")
        finally:
            os.kill(pid, signal.SIGCONT)
        for _ in range(200):
            try:
                return await engine.check_health()
            except EngineDeadError:
                await asyncio.sleep(0.05)
        raise AssertionError("not healthy again")


def test_health_is_503_while_the_server_starts(checkpoints):
    """The port answers before the workers are READY: /health (and every route) a 503 saying the
    engine is starting, then 200 once the ready line is out."""
    import http.client
    import subprocess
    import sys

    from tests.serve.helpers import free_port

    port = free_port()
    argv = [sys.executable, "-m", "rlt", "serve", checkpoints["ouro"], "--port", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def health() -> tuple[int, bytes] | None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("GET", "/health")
            r = conn.getresponse()
            return r.status, r.read()
        except OSError:  # (not listening yet)
            return None
        finally:
            conn.close()

    try:
        while (got := health()) is None:
            time.sleep(0.02)
        assert got[0] == 503 and b"the engine is starting" in got[1], got
        assert "ready at" in proc.stdout.readline()
        assert health()[0] == 200
    finally:
        proc.terminate()
        proc.wait(30)
