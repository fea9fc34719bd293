"""rlt nodes behind Dynamo's KV-aware router (`python -m dynamo.frontend --router-mode kv`): real
etcd, the real frontend, aggregated rlt nodes on the tiny Ouro, each its own process. The nodes
publish KV events and load (rlt/dynamo/router_state.py), answer the health canary, serve rlt's
metrics on Dynamo's /metrics, leave discovery while their worker is down and drain on SIGTERM. One
stack for the module: the tests run in order (a third node joins, one's worker dies, one drains)."""

import asyncio
import glob
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import openai
import pytest

from tests.dynamo.helpers import Infra, _get, _start, _stop_all, _wait, assert_clean_exit
from tests.helpers import FAST_ARGS
from tests.processes import parent, workers_of

pytest.importorskip(
    "dynamo.common.backend", reason="the dynamo extra (README: Dynamo) is not installed"
)

# alone: each second turn must reach the router after the first turn's KV event and end have (they
# travel apart from the response); a second busy test worker can hold them back that long
pytestmark = [pytest.mark.slow, pytest.mark.alone]
TURN = 50  # a first turn's prompt tokens: 3 full blocks, which the second turn finds (48 cached)


def _system_port() -> int:
    """A free port below 32768 (Dynamo reads DYN_SYSTEM_PORT as an i16)."""
    while True:
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                pass


class KvStack(Infra):
    """etcd, the frontend in KV mode, and nodes started with node(); `served()`: the tokens each
    live node's /metrics counts as generated (which node served what)."""

    def __init__(self, tmp: str, model: str):
        super().__init__(tmp, "--router-mode", "kv")
        self.model, self.nodes, self.ports = model, {}, {}

    def node(
        self, name: str, *flags: str, role: str = "aggregated", served: str = "kv"
    ) -> subprocess.Popen:
        port = self.ports[name] = _system_port()
        env = self.env | {
            "DYN_SYSTEM_PORT": str(port),
            "DYN_HEALTH_CHECK_ENABLED": "true",
            "DYN_CANARY_WAIT_TIME": "1",
        }
        argv = [
            sys.executable,
            "-m",
            "rlt.dynamo",
            self.model,
            "--served-model-name",
            served,
            "--role",
            role,
        ]
        p = _start([*argv, *FAST_ARGS, *flags, "--namespace", "kvtest"], self.log(name), env)
        self.nodes[name] = p
        return p

    def log(self, name: str) -> str:
        return os.path.join(self.tmp, f"{name}.log")

    def health(self, name: str) -> str | None:
        h = _get(f"http://127.0.0.1:{self.ports[name]}/health")
        return None if h is None else re.search(r'"status":"(\w+)"', h).group(1)

    def wait_ready(self, name: str) -> None:
        _wait(
            lambda: self.health(name) == "ready", f"node {name}", self.nodes[name], self.log(name)
        )

    def metric(self, name: str, metric: str) -> float:
        text = _get(f"http://127.0.0.1:{self.ports[name]}/metrics") or ""
        return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(metric + "{"))

    def served(self) -> dict[str, float]:
        return {
            n: self.metric(n, "rlt:generation_tokens_total")
            for n, p in self.nodes.items()
            if p.poll() is None
        }

    def close(self) -> None:
        _stop_all(self.nodes.values())  # (at once: each waits out Dynamo's grace period)
        super().close()


@pytest.fixture(scope="module")
def kv(checkpoints):
    tmp = tempfile.mkdtemp(prefix="rlt-dynamo-kv-")
    s = KvStack(tmp, checkpoints["ouro"])
    try:
        for name in ("a", "b"):
            s.node(name)
        for name in ("a", "b"):
            s.wait_ready(name)
        _wait(
            lambda: '"kv"' in (_get(f"{s.url}/models") or ""),
            "the model at the frontend",
            s.frontend,
            s.log("a"),
        )
        yield s
    finally:
        s.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _client(s) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=s.url, api_key="none", max_retries=0, timeout=60)


async def _turn(
    client, prompt: list[int], max_tokens: int = 4, model: str = "kv"
) -> tuple[list[int], int]:
    """One greedy completion: (its token ids, its prompt's cached tokens)."""
    r = await client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True, "nvext": {"extra_fields": ["completion_token_ids"]}},
    )
    details = r.usage.prompt_tokens_details
    return r.model_extra["nvext"]["completion_token_ids"], details.cached_tokens if details else 0


def _conversations(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 300) for _ in range(TURN)] for _ in range(n)]


async def _two_turns(s: KvStack, firsts: list[list[int]]) -> list[tuple[str, str, int]]:
    """Each conversation's first turn, then (sequentially, so each is told apart in the nodes'
    metrics) its second: (node of the first, node of the second, the second's cached tokens)."""
    client, out = _client(s), []
    for prompt in firsts:
        before = s.served()
        reply, _ = await _turn(client, prompt)
        mid = s.served()
        _, cached = await _turn(client, prompt + reply + [7, 8, 9, 10])
        after = s.served()
        first = max(mid, key=lambda n: mid[n] - before.get(n, 0))
        out.append((first, max(after, key=lambda n: after[n] - mid.get(n, 0)), cached))
    return out


def test_second_turns_go_to_the_node_holding_their_prefix(kv):
    """16 two-turn conversations over two nodes: every second turn is routed to the node that
    served its first and finds its 3 blocks there (cached_tokens). The nodes' /metrics carry rlt's
    metrics with Dynamo's labels, and the load Dynamo sees counts rlt's blocks of every plane."""
    got = asyncio.run(_two_turns(kv, _conversations(16, 0)))
    hits = sum(first == second and cached == 48 for first, second, cached in got)
    print(
        f"second turns that hit their prefix through Dynamo's KV router: {hits}/16 ({hits / 16:.0%})"
    )
    assert hits == 16, got
    assert {first for first, _, _ in got} == {"a", "b"}  # (new prefixes spread over both)
    assert sum(kv.metric(n, "rlt:prefix_cache_hits_total") for n in "ab") >= 16 * 48
    text = _get(f"http://127.0.0.1:{kv.ports['a']}/metrics")
    assert re.search(r'rlt:exit_depth_count\{[^}]*dynamo_namespace="kvtest"[^}]*\} [1-9]', text), (
        text[-2000:]
    )
    logs = re.search(r"worker logs in (\S+)", open(kv.log("a")).read()).group(1)
    pool = int(
        re.search(
            r"KV pool: (\d+) blocks", open(glob.glob(f"{logs}/unified0.*.log")[0]).read()
        ).group(1)
    )
    # (one plane a loop)
    depth = json.load(open(os.path.join(kv.model, "config.json")))["total_ut_steps"]
    assert kv.metric("a", "dynamo_component_total_blocks") == pool // depth


def test_a_third_node_gets_new_prefixes(kv):
    """A node joining takes new conversations (six at once: the router balances their load), and
    their second turns come back to it."""
    kv.node("c")
    # c's start (torch, the model, its worker's warm-up) takes both cores: a and b may miss
    # heartbeats meanwhile and step out of discovery (router_state.py) until they are heard again
    for name in "cab":
        kv.wait_ready(name)
    client = _client(kv)
    firsts = _conversations(6, 1)

    async def all_at_once():
        return await asyncio.gather(*(_turn(client, p, max_tokens=24) for p in firsts))

    before = kv.served()
    replies = asyncio.run(all_at_once())
    assert kv.served()["c"] - before["c"] >= 24  # at least one of them
    seconds = asyncio.run(_two_turns(kv, [p + r for p, (r, _) in zip(firsts, replies)]))
    assert all(first == second and cached == 64 for first, second, cached in seconds), seconds


def _worker_pid(node: subprocess.Popen) -> int:
    """The node's rlt worker."""
    [worker] = workers_of(node.pid)
    return worker


def test_a_node_whose_worker_died_is_unhealthy_and_traffic_moves(kv):
    """Kill node c's rlt worker: c leaves discovery and fails the canary (its /health not ready)
    while the worker restarts; requests with the prefixes it held go to the other nodes meanwhile;
    once its worker is READY again it is healthy and back in discovery. (The worker's fork server
    is held stopped meanwhile: a restart takes a second, and this one waits for the test.)"""
    held = _conversations(4, 2)
    client = _client(kv)
    asyncio.run(_two_turns(kv, held))  # (the prefixes land somewhere; c's get killed with it)
    worker = _worker_pid(kv.nodes["c"])
    server = parent(worker)
    os.kill(server, signal.SIGSTOP)
    try:
        os.kill(worker, signal.SIGKILL)
        _wait(
            lambda: "out of discovery" in open(kv.log("c")).read(),
            "c out of discovery",
            kv.nodes["c"],
            kv.log("c"),
        )
        _wait(
            lambda: kv.health("c") != "ready", "c unhealthy", kv.nodes["c"], kv.log("c"), timeout=20
        )
        before = kv.served()

        async def during():
            return await asyncio.gather(*(_turn(client, p) for p in held))

        asyncio.run(during())  # all served, by a and b
        after = kv.served()
        assert after["c"] == before["c"] and sum(after.values()) - sum(before.values()) == 16
    finally:
        os.kill(server, signal.SIGCONT)
    kv.wait_ready("c")
    _wait(
        lambda: "back in discovery" in open(kv.log("c")).read(),
        "c back",
        kv.nodes["c"],
        kv.log("c"),
    )


def test_a_draining_node_loses_nothing(kv):
    """SIGTERM a node while it streams the next turns of the conversations it holds: it leaves
    discovery (a request sent meanwhile goes elsewhere), its streams finish whole, then it exits
    with no live request and every block free."""
    client = _client(kv)
    firsts = _conversations(6, 3)
    got = asyncio.run(_two_turns(kv, firsts))
    node = got[0][0]  # the node to drain: the one holding the first conversation
    on_a = [p for p, (first, _, _) in zip(firsts, got) if first == node]

    async def streams():
        signalled = asyncio.Event()

        async def one(p):
            stream = await client.completions.create(
                model="kv",
                prompt=p,
                max_tokens=60,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            n, reason = 0, None
            async for chunk in stream:
                if chunk.usage is not None:
                    n = chunk.usage.completion_tokens
                reason = next((c.finish_reason for c in chunk.choices if c.finish_reason), reason)
                if not signalled.is_set():
                    signalled.set()
                    kv.nodes[node].send_signal(signal.SIGTERM)
            return n, reason

        async def meanwhile():
            await signalled.wait()
            await asyncio.sleep(0.5)
            return await _turn(client, firsts[-1])

        *ends, _ = await asyncio.gather(*(one(p) for p in on_a), meanwhile())
        return ends

    ends = asyncio.run(streams())
    assert ends == [(60, "length")] * len(on_a)
    assert kv.nodes[node].wait(60) == 0
    assert_clean_exit(kv.log(node))
