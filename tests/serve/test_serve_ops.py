"""`rlt serve` operated as a vLLM user expects: the port bound before anything loads (a busy one is
one line and exit 2), --max-model-len, several --served-model-name, CORS, X-Request-Id, a log line
per request, model_name on every metric and the queue / prefill / decode histograms. One server
(all of those flags) for the module; what needs no server runs on the app in process."""

import http.client
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import openai
import pytest

from rlt.models.model_config import ModelConfig
from tests.processes import processes_mentioning
from tests.serve.helpers import free_port, serving

MAX_MODEL_LEN = 64
OK_ORIGIN, BAD_ORIGIN = "https://ok.example", "https://evil.example"
FLAGS = ["--served-model-name", "m", "alias", "--max-model-len", str(MAX_MODEL_LEN)]
FLAGS += ["--allowed-origins", json.dumps([OK_ORIGIN])]
LINE = re.compile(
    r"^INFO \S+ \S+ rlt\.serve: (\S+) (\S+) (\d+) request_id=(\S+)(.*) e2e=(\d+\.\d{3})s$"
)


@pytest.fixture(scope="module")
def server(checkpoints):
    """(base URL, the server's output lines so far)."""
    lines: list[str] = []
    with serving(checkpoints["ouro"], *FLAGS, output=lines) as url:
        yield url, lines


def base(url: str) -> str:
    return url.removesuffix("/v1")


def call(
    url: str, method: str, path: str, body: dict | None = None, **headers
) -> tuple[int, dict, bytes]:
    """One request (headers as keyword arguments, '_' for '-') -> status, headers (lower-case
    names), the whole body."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        headers = {k.replace("_", "-"): v for k, v in headers.items()}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, u.path + path, json.dumps(body) if body is not None else None, headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def rlt(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlt", *argv], capture_output=True, text=True, timeout=60, **kw
    )


def log_line(lines: list[str], request_id: str) -> tuple:
    """(method, path, status, the fields between id and e2e, e2e) of the request's line, once written."""
    deadline = time.monotonic() + 10
    while True:
        for line in list(lines):
            if (m := LINE.match(line.rstrip("\n"))) and m.group(4) == request_id:
                return (
                    m.group(1),
                    m.group(2),
                    int(m.group(3)),
                    m.group(5).strip(),
                    float(m.group(6)),
                )
        assert time.monotonic() < deadline, "".join(lines[-20:])
        time.sleep(0.05)


# ---- 1. the port first ---------------------------------------------------------------------------
def test_a_busy_port_or_a_foreign_address_fails_before_anything_loads(checkpoints, tmp_path):
    """One line naming host:port and why, exit 2, before the engine starts: no worker spawned (its
    log directory is never made), nothing but that line written."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        logs = tmp_path / "logs"
        r = rlt("serve", checkpoints["ouro"], "--port", str(port), "--log-dir", str(logs))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"rlt: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert not logs.exists()  # (no worker was started: the model never loads)
    r = rlt(
        "serve",
        checkpoints["ouro"],
        "--host",
        "192.0.2.1",
        "--port",
        "8000",
        "--log-dir",
        str(logs),
    )
    assert (
        r.returncode == 2
        and r.stderr
        == "rlt: error: cannot listen on 192.0.2.1:8000: Cannot assign requested address\n"
    )
    assert not logs.exists() and processes_mentioning(str(logs)) == []


# ---- 2. --max-model-len --------------------------------------------------------------------------
def test_max_model_len_caps_every_request(server):
    url, _ = server
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    prompt = list(range(5, 5 + MAX_MODEL_LEN - 4))
    r = client.completions.create(
        model="m", prompt=prompt, max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert r.usage.completion_tokens == 4  # exactly the context
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt=prompt, max_tokens=5)
    assert e.value.status_code == 400 and str(MAX_MODEL_LEN) in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt=[5] * (MAX_MODEL_LEN + 1), max_tokens=1)
    assert (
        e.value.body["param"] == "prompt"
        and f"max positions {MAX_MODEL_LEN}" in e.value.body["message"]
    )
    chat = client.chat.completions.create(  # no max_tokens: what the context leaves, the cap's
        model="m", messages=[{"role": "user", "content": "Hi"}], extra_body={"ignore_eos": True}
    )
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == MAX_MODEL_LEN


def test_max_model_len_past_the_models_is_refused_by_serve_and_generate(checkpoints):
    r = rlt("serve", checkpoints["ouro"], "--port", str(free_port()), "--max-model-len", "100000")
    assert r.returncode == 2
    assert r.stderr == (
        "rlt: error: max_model_len 100000 is more than the model's max positions 65536 "
        "(config.json's max_position_embeddings)\n"
    )
    r = rlt(
        "generate",
        "--model",
        checkpoints["ouro"],
        "--max-model-len",
        "8",
        "--prompt-token-ids",
        "1,2,3,4,5,6,7",
    )
    assert r.returncode == 2 and "exceeds the model's max positions 8" in r.stderr, r.stderr


def test_max_model_len_is_in_the_model_config_the_workers_rebuild(checkpoints):
    """The coordinator's ModelConfig carries the cap in the config dict the handshake sends; a worker
    rebuilding from it (ModelConfig.from_dict) gets the same max_positions."""
    from rlt.control.frontend import Engine

    # (not started: no worker)
    mc = Engine.launch(checkpoints["ouro"], max_model_len=40).engine.model_config
    assert (mc.max_positions, mc.model_max_positions, mc.max_model_len) == (40, 65536, 40)
    assert (
        ModelConfig.from_dict(mc.raw, mc.path) == mc
        and ModelConfig.from_dict(mc.raw).max_positions == 40
    )
    assert Engine.launch(checkpoints["ouro"]).engine.model_config.max_positions == 65536


# ---- 3. several served names ---------------------------------------------------------------------
def test_every_served_name_is_listed_and_answers_under_its_own_name(server):
    url, _ = server
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["m", "alias"]
    for name in ("m", "alias"):
        assert client.completions.create(model=name, prompt="The river", max_tokens=2).model == name
        stream = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, stream=True
        )
        assert {chunk.model for chunk in stream} == {name}
    status, _, answer = call(url, "POST", "/completions", {"prompt": "The river", "max_tokens": 2})
    assert status == 200 and json.loads(answer)["model"] == "m"  # none given: the first
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x", max_tokens=1)


# ---- 4. CORS -------------------------------------------------------------------------------------
def test_cors_preflight_and_simple_requests(server):
    url, _ = server
    preflight = {
        "Access_Control_Request_Method": "POST",
        "Access_Control_Request_Headers": "authorization",
    }
    status, ok, _ = call(url, "OPTIONS", "/completions", Origin=OK_ORIGIN, **preflight)
    assert status == 200 and ok["access-control-allow-origin"] == OK_ORIGIN
    assert "POST" in ok["access-control-allow-methods"].split(", ")
    assert ok["access-control-allow-headers"].lower() == "authorization"
    status, bad, _ = call(url, "OPTIONS", "/completions", Origin=BAD_ORIGIN, **preflight)
    assert status == 400 and "access-control-allow-origin" not in bad
    status, simple, _ = call(url, "GET", "/models", Origin=OK_ORIGIN)
    assert status == 200 and simple["access-control-allow-origin"] == OK_ORIGIN
    assert simple["access-control-expose-headers"] == "X-Request-Id"
    status, other, _ = call(url, "GET", "/models", Origin=BAD_ORIGIN)
    assert status == 200 and "access-control-allow-origin" not in other


def test_no_cors_headers_unless_an_origin_is_allowed():
    from starlette.testclient import TestClient

    from rlt.serve.app import build_app

    r = TestClient(build_app(None, "m", None, {})).get("/v1/models", headers={"Origin": OK_ORIGIN})
    assert r.status_code == 200 and not any(k.startswith("access-control-") for k in r.headers)


# ---- 5. X-Request-Id, 6. the log line ------------------------------------------------------------
def test_request_ids_are_echoed_and_each_request_logged(server):
    url, lines = server
    body = {"model": "alias", "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0}
    status, headers, _ = call(url, "POST", "/completions", body, X_Request_Id="whole-1")
    assert status == 200 and headers["x-request-id"] == "whole-1"
    status, headers, events = call(
        url, "POST", "/completions", body | {"stream": True}, X_Request_Id="stream-1"
    )
    assert headers["x-request-id"] == "stream-1" and events.endswith(b"data: [DONE]\n\n")
    fresh = call(url, "GET", "/models")[1]["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", fresh)
    for sent in ("x" * 129, "two words"):  # too long, or not visible ASCII: a fresh id instead
        got = call(url, "GET", "/models", X_Request_Id=sent)[1]["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", got)
    status, headers, _ = call(
        url, "POST", "/completions", body | {"max_tokens": -1}, X_Request_Id="bad-1"
    )
    assert status == 400 and headers["x-request-id"] == "bad-1"
    for rid, status in (("whole-1", 200), ("stream-1", 200), ("bad-1", 400)):
        method, path, got, fields, e2e = log_line(lines, rid)
        assert (method, path, got) == ("POST", "/v1/completions", status) and e2e >= 0
        if status == 200:  # what the handler recorded: the call's tokens and its first token's time
            assert re.fullmatch(r"prompt_tokens=3 completion_tokens=3 ttft=\d+\.\d{3}s", fields), (
                fields
            )
        else:
            assert fields == "", fields
    assert log_line(lines, fresh)[:3] == ("GET", "/v1/models", 200)


def test_5xx_at_warning_and_disable_log_requests(caplog):
    """An unhandled exception's 500 carries the request's id and is logged at WARNING; with
    --disable-log-requests only such lines remain."""
    from starlette.testclient import TestClient

    from rlt.cli import build_parser
    from rlt.serve.app import build_app
    from rlt.serve.flags import server_options_of

    args = build_parser().parse_args(["serve", "--disable-log-requests"])
    assert server_options_of(args).log_requests is False
    for options in (None, server_options_of(args)):
        app = build_app(None, "m", None, {}, options=options)

        @app.get("/boom")
        async def boom():
            raise RuntimeError("boom")

        caplog.clear()
        with caplog.at_level(logging.INFO, logger="rlt.serve"):
            client = TestClient(app, raise_server_exceptions=False)
            assert client.get("/v1/models", headers={"X-Request-Id": "fine"}).status_code == 200
            r = client.get("/boom", headers={"X-Request-Id": "boom-1"})
        assert r.status_code == 500 and r.headers["x-request-id"] == "boom-1"
        got = [(rec.levelname, rec.getMessage().rsplit(" e2e=", 1)[0]) for rec in caplog.records]
        quiet = [("WARNING", "GET /boom 500 request_id=boom-1")]
        assert got == (
            quiet if options else [("INFO", "GET /v1/models 200 request_id=fine"), *quiet]
        )


# ---- 7. metrics ----------------------------------------------------------------------------------
NAMES = [
    "rlt:num_requests_running",
    "rlt:num_requests_waiting",
    "rlt:kv_cache_usage_perc",
    "rlt:prefix_cache_blocks",
    "rlt:num_preemptions_total",
    "rlt:prefix_cache_queries_total",
    "rlt:prefix_cache_hits_total",
    "rlt:kv_handoff_bytes_total",
    "rlt:kv_handoff_seconds_total",
    "rlt:prompt_tokens_total",
    "rlt:generation_tokens_total",
    "rlt:request_success_total",
]
HISTOGRAMS = [
    "rlt:time_to_first_token_seconds",
    "rlt:time_per_output_token_seconds",
    "rlt:inter_token_latency_seconds",
    "rlt:e2e_request_latency_seconds",
    "rlt:request_queue_time_seconds",
    "rlt:request_prefill_time_seconds",
    "rlt:request_decode_time_seconds",
    "rlt:exit_depth",
]


def metric_lines(url: str) -> list[tuple[str, dict, float]]:
    with urllib.request.urlopen(base(url) + "/metrics") as r:
        text = r.read().decode()
    out = []
    for line in text.splitlines():
        if line.startswith("rlt:"):
            sample, value = line.rsplit(" ", 1)
            name, _, labels = sample.partition("{")
            out.append((name, dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value)))
    return out


def test_every_metric_is_labelled_with_the_first_served_name(server):
    url, _ = server
    before = metric_lines(url)
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    client.completions.create(model="alias", prompt=[5, 6, 7], max_tokens=3, temperature=0)
    after = metric_lines(url)
    assert {labels.get("model_name") for _, labels, _ in after} == {"m"}
    names = {name for name, _, _ in after}
    assert set(NAMES) <= names
    for h in HISTOGRAMS:
        assert {h + "_bucket", h + "_count", h + "_sum"} <= names, h

    def count(lines, name):
        return sum(v for n, labels, v in lines if n == name)

    grew = {h: count(after, h + "_count") - count(before, h + "_count") for h in HISTOGRAMS}
    once = [h for h in HISTOGRAMS if h not in ("rlt:inter_token_latency_seconds", "rlt:exit_depth")]
    # one request: each phase (the engine's times)
    assert {h: grew[h] for h in once} == dict.fromkeys(once, 1)
    assert grew["rlt:exit_depth"] == 3  # each token


def test_health_is_503_once_a_needed_worker_is_dead_and_not_restarted(checkpoints):
    """--no-restart: the only worker killed, /health answers 503 (in OpenAI's shape, Retry-After)
    for as long as the app runs (`rlt serve` then exits 1: tests/control/test_load.py)."""
    from starlette.testclient import TestClient

    from rlt.control.frontend import Engine
    from rlt.serve.app import build_app

    def launch():
        return Engine.launch(checkpoints["ouro"], restart=False, heartbeat_timeout=3.0)

    with TestClient(build_app(launch, "m", None, {})) as client:
        while (r := client.get("/health")).status_code == 503 and "starting" in r.json()["error"][
            "message"
        ]:
            time.sleep(0.05)  # (the app answers while its engine starts)
        assert r.status_code == 200
        engine = client.app.state.engine
        os.kill(engine.stats().workers[0].pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (r := client.get("/health")).status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert (
            r.status_code == 503
            and r.headers["retry-after"] == "1"
            and r.json()["error"]["code"] == 503
        )
        time.sleep(0.5)
        assert client.get("/health").status_code == 503  # (no restart: it stays so)
