"""What the tests of `rlt serve` (and of the front ends beside it) share: a free port, a server
subprocess and its log, a metrics scrape, raw HTTP requests and OpenAI's error shape, and the
structured-output cases sent to a server."""

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

from tests.helpers import FAST_ARGS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drain(proc: subprocess.Popen, lines: list) -> threading.Thread:
    """Read the server's output into `lines` as it comes (its log goes on: a pipe nobody reads
    fills, and the server would block on it)."""
    t = threading.Thread(target=lines.extend, args=(proc.stdout,), daemon=True)
    t.start()
    return t


@contextlib.contextmanager
def serving(model: str, *flags: str, output: list | None = None):
    """`rlt serve MODEL` until its ready line -> base URL; SIGINT (as Ctrl-C) and wait on exit.
    output: gets every line the server writes (stdout and stderr)."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "rlt",
        "serve",
        model,
        "--port",
        str(port),
        "--served-model-name",
        "m",
        *FAST_ARGS,
        *flags,
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline, lines = time.monotonic() + 90, []
        while True:
            line = proc.stdout.readline()
            lines.append(line)
            if "ready at" in line:
                break
            assert line and time.monotonic() < deadline, "".join(lines)
        drain(proc, output if output is not None else [])
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise


def scrape(url: str) -> dict[str, float]:
    """Each sample by name and labels, less the model_name label every rlt: metric has."""
    with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics") as r:
        text = r.read().decode()
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#")
    return {_unlabelled(k): float(v) for k, v in samples}


def _unlabelled(sample: str) -> str:
    s = re.sub(r'model_name="[^"]*"', "", sample)
    return s.replace(",,", ",").replace("{,", "{").replace(",}", "}").replace("{}", "")


JSON = {"Content-Type": "application/json"}


def post(url: str, path: str, body: dict) -> tuple[int, dict]:
    status, _, answer = request(url.removesuffix("/v1"), "POST", path, body, JSON)
    return status, answer


KEY = "k1"


AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


def address(url: str) -> tuple[str, int]:
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port


def request(url: str, method: str, path: str, body=None, headers=AUTH) -> tuple[int, dict, dict]:
    """-> status, headers (lower-case names), the JSON body."""
    conn = http.client.HTTPConnection(*address(url), timeout=60)
    try:
        raw = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method, path, body=raw, headers=headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(r.read())
    finally:
        conn.close()


def openai_error(body: dict, status: int, param: str | None = None) -> dict:
    """The error object, checked for OpenAI's shape and a bounded message."""
    e = body["error"]
    assert (
        set(e) == {"message", "type", "param", "code"}
        and e["code"] == status
        and e["param"] == param
    ), e
    assert (
        isinstance(e["message"], str)
        and 0 < len(e["message"]) <= 400
        and isinstance(e["type"], str)
    )
    return e


SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["a", "b"]},
        "ok": {"type": "boolean"},
        "name": {"type": "string", "maxLength": 4},
    },
    "required": ["kind", "ok", "name"],
    "additionalProperties": False,
}


WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Oslo", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 3},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}


SEARCH = {
    "type": "object",
    "properties": {"q": {"type": "boolean"}},
    "required": ["q"],
    "additionalProperties": False,
}


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "search", "parameters": SEARCH}},
]


PARAMS = {"get_weather": WEATHER, "search": SEARCH}


USER = [{"role": "user", "content": "Weather?"}]


REGEX, CHOICES = r"[a-c]{2,4}-[0-9]{2}", ["yes", "no", "maybe so"]
