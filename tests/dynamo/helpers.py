"""Dynamo's real infrastructure for the tests: an etcd server and Dynamo's frontend (Infra), rlt
nodes as `python -m rlt.dynamo` processes (Stack), and waiting on them."""

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from tests.helpers import FAST_ARGS
from tests.serve.helpers import free_port


def _wait(check, what: str, proc: subprocess.Popen, log: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            with open(log) as f:
                raise AssertionError(
                    f"{what} did not come up (exit {proc.poll()}):\n{f.read()[-3000:]}"
                )
        time.sleep(0.2)


def _start(argv: list[str], log: str, env: dict) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _stop(proc: subprocess.Popen, sig=signal.SIGINT, timeout: float = 30.0) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(
                f"{proc.args[:4]} did not exit within {timeout} s of {sig.name}"
            ) from None


def _stop_all(procs, sig=signal.SIGINT, timeout: float = 30.0) -> None:
    """_stop of each, their shutdowns at once (the signals in order)."""
    procs = [p for p in procs if p.poll() is None]
    for p in procs:
        p.send_signal(sig)
    deadline = time.monotonic() + timeout
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.0, deadline - time.monotonic()))
        _stop(p, sig, 0.0)  # (one still running: killed, and an AssertionError)


class Infra:
    """etcd + Dynamo's frontend, shared by the module's tests (each test its own namespace and
    model name: nothing of one test is visible to another's workers)."""

    def __init__(self, tmp: str, *frontend_flags: str):
        self.tmp = tmp
        port, peer, http = free_port(), free_port(), free_port()
        # UCX_TLS=tcp: KV moves over TCP on the loopback, as between hosts without RDMA (not through
        # the shared-memory transports processes of one host could use)
        self.env = os.environ | {
            "ETCD_ENDPOINTS": f"http://127.0.0.1:{port}",
            "DYN_LOG": "warn",
            "UCX_TLS": "tcp",
        }
        etcd = [
            "etcd",
            "--data-dir",
            os.path.join(tmp, "etcd"),
            "--listen-client-urls",
            f"http://127.0.0.1:{port}",
        ]
        etcd += [
            "--advertise-client-urls",
            f"http://127.0.0.1:{port}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
        ]
        self.etcd = _start(etcd, os.path.join(tmp, "etcd.log"), self.env)
        _wait(
            lambda: _get(f"http://127.0.0.1:{port}/health") is not None,
            "etcd",
            self.etcd,
            f"{tmp}/etcd.log",
        )
        front = [
            sys.executable,
            "-m",
            "dynamo.frontend",
            "--http-port",
            str(http),
            "--discovery-backend",
            "etcd",
        ]
        front += frontend_flags
        self.frontend = _start(front, os.path.join(tmp, "frontend.log"), self.env)
        self.url = f"http://127.0.0.1:{http}/v1"

    def close(self) -> None:
        _stop(self.frontend)
        _stop(self.etcd, signal.SIGTERM)


class Stack:
    """One test's workers on the shared infrastructure; `model` is the name its clients use."""

    def __init__(self, infra: Infra, n: int):
        # no 5 s grace period at a node's SIGINT/SIGTERM (Dynamo's wait for load balancers to notice
        # it left discovery; its in-flight requests are still drained after it): every test stops
        # its nodes with nothing in flight, or drains what is (a prefill node's own drain)
        self.infra, self.url = infra, infra.url
        self.env = infra.env | {"DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS": "0"}
        self.tmp, self.procs = tempfile.mkdtemp(prefix="rlt-dynamo-"), []
        self.namespace, self.model = f"test{n}", f"m{n}"

    def log(self, name: str) -> str:
        return os.path.join(self.tmp, f"{name}.log")

    def worker(
        self, model: str, name: str = "worker", *flags: str, main=("-m", "rlt.dynamo")
    ) -> subprocess.Popen:
        argv = [sys.executable, *main, model, "--served-model-name", self.model, *FAST_ARGS, *flags]
        p = _start(
            argv + ["--discovery-backend", "etcd", "--namespace", self.namespace],
            self.log(name),
            self.env,
        )
        self.procs.append(p)
        return p

    def wait_model(self, proc: subprocess.Popen, name: str = "worker") -> None:
        def listed():
            models = _get(f"{self.url}/models")
            return models is not None and f'"{self.model}"' in models

        _wait(listed, "the worker's model at the frontend", proc, self.log(name))

    def close(self) -> None:
        _stop_all(reversed(self.procs))
        shutil.rmtree(self.tmp, ignore_errors=True)


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


_tests = itertools.count()


def assert_clean_exit(log: str) -> None:
    """The node's exit line: no live request, nothing pending, every block of its worker free."""
    with open(log) as f:
        line = next(ln for ln in f if ln.startswith("rlt node at exit"))
    assert "0 live requests, 0 pending cleanup" in line, line
    free, total = map(int, line.split(" worker ")[1].split(" KV")[0].split(" of "))
    assert free == total, line
