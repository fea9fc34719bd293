"""rlt as an NVIDIA Dynamo backend, on Dynamo's real infrastructure: an etcd server for discovery,
Dynamo's OpenAI frontend and `python -m rlt.dynamo` workers, each its own process, sharing only the
network (TCP request plane; KV over UCX's TCP transport). Driven by the official `openai` client;
outputs equal rlt's own `single` topology. Needs the `dynamo` extra's packages and an `etcd`
binary (.ci/run installs both)."""

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

import openai
import pytest

import rlt
from rlt import SamplingParams
from tests.dynamo.helpers import Stack, _stop, _tests, assert_clean_exit
from tests.helpers import HUGINN

pytest.importorskip(
    "dynamo.common.backend", reason="the dynamo extra (README: Dynamo) is not installed"
)
if shutil.which("etcd") is None:
    pytest.skip("no etcd binary (Debian: apt-get install etcd-server)", allow_module_level=True)

pytestmark = pytest.mark.slow


def _group_alive(pgid: int) -> bool:
    """Any process left in the session a worker started (its rlt worker subprocess among them)."""
    out = subprocess.run(["ps", "-eo", "pgid="], capture_output=True, text=True).stdout.split()
    return str(pgid) in out


@pytest.fixture
def stack(infra):
    """`with stack() as s:` — this test's workers, stopped at the end."""

    @contextlib.contextmanager
    def make():
        s = Stack(infra, next(_tests))
        try:
            yield s
        finally:
            s.close()

    return make


async def single(model, jobs, hf_overrides=None):
    """rlt's own single topology: the final output of each (prompt, SamplingParams), one engine."""
    async with rlt.Engine.launch(model, hf_overrides=hf_overrides, heartbeat_timeout=3.0) as engine:
        outs = []
        for prompt, sp in jobs:
            async for out in engine.generate(prompt, sp):
                pass
            outs.append(out)
        return outs


def cases(family: str) -> tuple[list[dict], list[SamplingParams]]:
    """Greedy and seeded (top-k, top-p) requests with logprobs, and adaptive exit and speculation (the
    loop options as nvext annotations: Ouro's gate, Huginn's exit criterion), as the openai client's arguments and
    as rlt SamplingParams. Each
    asks for the token ids and rlt's exit depths (nvext extra fields), and logprobs naming the
    token ids ("token_id:42")."""
    requests = [
        dict(max_tokens=9, temperature=0),
        dict(max_tokens=9, temperature=0.9, top_p=0.9, seed=11, extra_body={"top_k": 20}),
    ]
    sps = [
        SamplingParams(max_tokens=9, temperature=0, logprobs=1),
        SamplingParams(max_tokens=9, temperature=0.9, top_p=0.9, top_k=20, seed=11, logprobs=1),
    ]
    if family == "ouro":
        requests.append(
            dict(
                max_tokens=9,
                temperature=0,
                extra_body={"nvext": {"annotations": ["exit_threshold=0.5"]}},
            )
        )
        sps.append(SamplingParams(max_tokens=9, temperature=0, exit_threshold=0.5, logprobs=1))
        spec = ["speculative_loops=1", "speculative_tokens=2"]  # self-speculation: the same tokens
        requests.append(
            dict(max_tokens=9, temperature=0, extra_body={"nvext": {"annotations": spec}})
        )
        sps.append(
            SamplingParams(
                max_tokens=9, temperature=0, logprobs=1, speculative_loops=1, speculative_tokens=2
            )
        )
    elif family == "huginn":  # an exit criterion; argmax-stability's threshold counts checks
        loop = ["exit_criterion=argmax-stability", "exit_threshold=2"]
        requests.append(
            dict(max_tokens=9, temperature=0, extra_body={"nvext": {"annotations": loop}})
        )
        crit = dict(exit_criterion="argmax-stability", exit_threshold=2)
        sps.append(SamplingParams(max_tokens=9, temperature=0, logprobs=1, **crit))
    for r in requests:
        body = r.setdefault("extra_body", {})
        body["return_tokens_as_token_ids"] = True
        body["nvext"] = body.get("nvext", {}) | {
            "extra_fields": ["completion_token_ids", "engine_data"]
        }
    return requests, sps


def assert_equal(got, want) -> None:
    """The token ids, exit depths, finish reason and each token's logprob equal rlt's own. (Not the
    text: for tokens that are parts of a UTF-8 character, Dynamo's detokenizer and rlt's may write
    a different number of U+FFFD between them.)"""
    for r, out in zip(got, want, strict=True):
        c, nvext = r.choices[0], r.model_extra["nvext"]
        assert nvext["completion_token_ids"] == out.token_ids
        assert nvext["engine_data"]["request_exit_depths"] == out.exit_depths
        assert c.logprobs.tokens == [f"token_id:{t}" for t in out.token_ids]
        assert (c.finish_reason, r.usage.completion_tokens) == (
            out.finish_reason,
            len(out.token_ids),
        )
        lps = [pos[t] for t, pos in zip(out.token_ids, out.logprobs)]
        assert c.logprobs.token_logprobs == pytest.approx(lps, abs=1e-5)


@pytest.fixture(scope="module")
def ouro_worker(checkpoints, infra):
    """An aggregated node of the tiny Ouro, on a stack of its own: test_completions_through_dynamo's
    aggregated case sends it its requests first (its prefix cache empty), then
    test_a_killed_worker_fails_its_requests_and_a_new_one_rejoins kills it. (Stack, node)"""
    s = Stack(infra, next(_tests))
    try:
        w = s.worker(checkpoints["ouro"])
        s.wait_model(w)
        yield s, w
    finally:
        s.close()


PROMPT = [5 + (7 * j) % 300 for j in range(40)]  # (3 blocks and a half)


@pytest.fixture(scope="module")
def single_outputs(checkpoints):
    """family -> rlt's single topology's outputs for PROMPT and cases(family), computed once for the
    module (Ouro's aggregated and prefill+decode cases are compared with the same)."""
    memo = {}

    def get(family: str) -> list:
        if family not in memo:
            jobs = [(PROMPT, sp) for sp in cases(family)[1]]
            memo[family] = asyncio.run(
                single(checkpoints[family], jobs, HUGINN if family == "huginn" else None)
            )
        return memo[family]

    return get


@pytest.mark.parametrize(
    "family,nodes",
    [("ouro", "aggregated"), ("ouro", "prefill+decode"), ("huginn", "prefill+decode")],
)
def test_completions_through_dynamo_equal_single(
    checkpoints, stack, single_outputs, request, family, nodes
):
    """One aggregated worker; or a prefill node and a decode node (separate processes, separate
    NIXL agents, KV over UCX: the decode node reserves, the prefill node computes every depth plane
    of a prompt of several blocks and writes it into the decode node's blocks, the first token comes
    from it). Either way the outputs equal rlt's single topology. (Huginn: its boundary planes and
    seeded initial state, --hf-overrides; Nanbeige's planes are Ouro's without the gate, and every
    family's KV handoff is checked in tests/workers/test_pd.py.)"""
    prompt = PROMPT
    requests, _ = cases(family)
    flags = ["--hf-overrides", '{"mean_recurrence": 6}'] if family == "huginn" else []
    # aggregated: the module's Ouro node (stopped at the module's end); else nodes of its own
    shared = (
        contextlib.nullcontext(request.getfixturevalue("ouro_worker")[0])
        if nodes == "aggregated"
        else None
    )
    with shared or stack() as s:
        if nodes != "aggregated":
            p = s.worker(checkpoints[family], "prefill", "--role", "prefill", *flags)
            w = s.worker(checkpoints[family], "decode", "--role", "decode", *flags)
            s.wait_model(w, "decode")
        client = openai.OpenAI(base_url=s.url, api_key="none", max_retries=0)
        got = [
            client.completions.create(model=s.model, prompt=prompt, logprobs=1, **r)
            for r in requests
        ]
        # the prompt again: found in the prefix cache (Huginn's like-init KV depends on each one's
        # seed)
        cached = [g.usage.prompt_tokens_details.cached_tokens for g in got]
        assert cached[0] == 0 and (family == "huginn" or cached[1:] == [32] * (len(got) - 1)), (
            cached
        )
        if family == "huginn":  # a bad loop option: a 400 naming it, rlt's own validation's words
            refused = [
                (["exit_criterion=halting"], "exit_criterion must be one of gate, latent-diff"),
                (
                    ["exit_criterion=argmax-stability", "exit_threshold=2.5"],
                    "argmax-stability counts checks",
                ),
                (
                    ["exit_criterion=kl", "exit_threshold=x"],
                    "exit_threshold must be a finite number, got 'x'",
                ),
            ]
            for loop, msg in refused:
                with pytest.raises(openai.BadRequestError) as e:
                    client.completions.create(
                        model=s.model,
                        prompt=prompt,
                        max_tokens=2,
                        extra_body={"nvext": {"annotations": loop}},
                    )
                assert msg in e.value.message, e.value.message
        if nodes != "aggregated":
            _stop(w)
            _stop(p)
            with open(s.log("prefill")) as f:
                assert f"{len(requests)} prompts prefilled" in f.read()
    assert_equal(got, single_outputs(family))


def test_responses_through_dynamos_frontend(ouro_worker):
    """OpenAI's Responses API through Dynamo's frontend (it turns /v1/responses into a chat request
    for the worker): the same text as the chat request it stands for, streamed too."""
    s, _ = ouro_worker
    client = openai.OpenAI(base_url=s.url, api_key="none", max_retries=0, timeout=60)
    question = "Where does the river run?"
    kw = dict(model=s.model, input=question, max_output_tokens=6, temperature=0)
    r = client.responses.create(**kw)
    messages = [{"role": "user", "content": question}]
    chat = client.chat.completions.create(
        model=s.model, messages=messages, max_tokens=6, temperature=0
    )
    assert r.output_text == chat.choices[0].message.content and r.output_text
    with client.responses.stream(**kw) as stream:
        events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == r.output_text


def test_two_decode_nodes_share_a_prefill_node(checkpoints, stack):
    """Requests at once through two decode nodes (each numbering its own requests from 1) and one
    prefill node: each KV handoff lands in the right decode node's blocks under the right request."""
    requests, sps = cases("ouro")
    prompts = [[5 + (7 * j + 3 * i) % 300 for j in range(20 + 9 * i)] for i in range(6)]
    with stack() as s:
        p = s.worker(checkpoints["ouro"], "prefill", "--role", "prefill")
        ds = [s.worker(checkpoints["ouro"], f"decode{i}", "--role", "decode") for i in range(2)]
        for i, d in enumerate(ds):
            s.wait_model(d, f"decode{i}")
        time.sleep(1.0)  # (the frontend lists both decode nodes)
        client = openai.AsyncOpenAI(base_url=s.url, api_key="none", max_retries=0)

        async def all_at_once():
            calls = [
                client.completions.create(model=s.model, prompt=q, logprobs=1, **r)
                for q in prompts
                for r in requests
            ]
            return await asyncio.gather(*calls)

        got = asyncio.run(all_at_once())
        for d in ds:
            _stop(d)
        _stop(p)
        with open(s.log("prefill")) as f:
            assert f"{len(got)} prompts prefilled" in f.read()
    want = asyncio.run(single(checkpoints["ouro"], [(q, sp) for q in prompts for sp in sps]))
    assert_equal(got, want)


def test_a_killed_worker_fails_its_requests_and_a_new_one_rejoins(checkpoints, ouro_worker):
    """SIGKILL a worker mid-stream: that stream ends in an error, nothing hangs; a worker started
    again serves the same model; SIGINT then stops it with its rlt worker process. (The worker is
    the module's aggregated Ouro node, its last user.)"""
    s, w = ouro_worker
    client = openai.OpenAI(base_url=s.url, api_key="none", max_retries=0, timeout=30)
    stream = client.completions.create(
        model=s.model,
        prompt=[5, 6, 7],
        max_tokens=4000,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    got = 0
    with pytest.raises((openai.APIError, openai.APIConnectionError)):
        for chunk in stream:
            got += 1
            if got == 3:
                os.killpg(w.pid, signal.SIGKILL)  # the worker and its rlt worker process
    assert got >= 3
    w2 = s.worker(checkpoints["ouro"], "worker2")
    r = _served_once_up(client, s, [5, 6, 7], w2, "worker2")  # (the dead one leaves discovery)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    _stop(w2)
    assert not _group_alive(w2.pid)  # no rlt worker process outlives its Dynamo worker


def _served_once_up(client, s, prompt, proc, name: str, timeout: float = 90.0):
    """A 5-token completion, retried until a node just started (`proc`, its log `name`) serves it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.completions.create(
                model=s.model, prompt=prompt, max_tokens=5, temperature=0
            )
        except openai.APIError:
            assert time.monotonic() < deadline and proc.poll() is None, open(s.log(name)).read()[
                -3000:
            ]
            time.sleep(0.5)


def test_a_killed_prefill_node_fails_only_what_it_holds_and_a_new_one_rejoins(checkpoints, stack):
    """A request already handed to the decode node finishes when the prefill node dies; while no
    prefill node serves, a new request fails with that reason (the decode node stays up); a prefill
    node started again serves the next ones; SIGINT stops every node with its rlt worker."""
    with stack() as s:
        p = s.worker(checkpoints["ouro"], "prefill", "--role", "prefill")
        d = s.worker(checkpoints["ouro"], "decode", "--role", "decode", "--transfer-timeout", "2")
        s.wait_model(d, "decode")
        client = openai.OpenAI(base_url=s.url, api_key="none", max_retries=0, timeout=30)
        whole = client.completions.create(
            model=s.model, prompt=[5, 6, 7], max_tokens=300, temperature=0
        )
        stream = client.completions.create(
            model=s.model,
            prompt=[5, 6, 7],
            max_tokens=300,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        texts = []
        for chunk in stream:
            texts += [c.text for c in chunk.choices]
            if len(texts) == 3:
                os.killpg(p.pid, signal.SIGKILL)  # the prefill node and its rlt worker
                p.wait()
        assert chunk.choices[-1].finish_reason == "length"
        # nobody to prefill it: 503, the reason logged
        with pytest.raises(openai.InternalServerError) as e:
            client.completions.create(
                model=s.model, prompt=[9, 10, 11], max_tokens=5, temperature=0
            )
        assert e.value.status_code == 503 and d.poll() is None
        with open(s.log("decode")) as f:
            assert "prefill node" in f.read()  # (no instance, or the dead one still listed)
        p2 = s.worker(checkpoints["ouro"], "prefill2", "--role", "prefill")
        r = _served_once_up(client, s, [9, 10, 11], p2, "prefill2")
        assert r.usage.completion_tokens == 5
        time.sleep(2.5)  # past the transfer deadline of the requests whose stream broke
        _stop(d)
        _stop(p2)
        assert not _group_alive(d.pid) and not _group_alive(p2.pid)
        assert_clean_exit(s.log("decode"))
    assert "".join(texts) == whole.choices[0].text  # the stream that outlived its prefill node


# a prompt's first token, and how long its KV write is held (an injected fault)
SLOW, SLOW_S = 251, 5.0
SLOWED_NODE = f"""
import sys

import rlt
from rlt.contract.config import Faults

_launch = rlt.Engine.launch
faults = Faults(slow_transfer_first_token={SLOW}, slow_transfer_seconds={SLOW_S})
rlt.Engine.launch = lambda *a, **kw: _launch(*a, faults=faults, **kw)
from rlt.dynamo.main import main

sys.exit(main(sys.argv[1:]))
"""


async def _log_line(proc: subprocess.Popen, log: str, text: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while not (line := next((ln for ln in open(log) if text in ln), None)):
        assert proc.poll() is None and time.monotonic() < deadline, open(log).read()[-3000:]
        await asyncio.sleep(0.1)
    return line


async def test_a_prefill_node_stopped_with_sigterm_finishes_what_it_holds(checkpoints, stack):
    """SIGTERM a prefill node while it holds a prefill (its KV write held SLOW_S by an injected
    fault): it leaves discovery at once (a request sent meanwhile is not given to it: with no other
    prefill node it gets a 503, and is served once a new one is up), finishes the prefill it holds
    (its request completes with the tokens the new node's gives for the same prompt), then exits 0;
    the decode node stops with every block free."""
    prompt = [SLOW] + [5 + (7 * j) % 300 for j in range(39)]
    body = {"ignore_eos": True, "nvext": {"extra_fields": ["completion_token_ids"]}}
    kw = dict(max_tokens=9, temperature=0, extra_body=body)
    with stack() as s:
        p = s.worker(checkpoints["ouro"], "prefill", "--role", "prefill", main=("-c", SLOWED_NODE))
        d = s.worker(checkpoints["ouro"], "decode", "--role", "decode")
        s.wait_model(d, "decode")
        client = openai.AsyncOpenAI(base_url=s.url, api_key="none", max_retries=0, timeout=60)
        t0 = time.monotonic()
        held = asyncio.ensure_future(client.completions.create(model=s.model, prompt=prompt, **kw))
        await asyncio.sleep(1.5)  # (prefilled in milliseconds: its KV write is held)
        p.send_signal(signal.SIGTERM)
        assert "draining 1 prefills" in await _log_line(p, s.log("prefill"), "out of discovery")
        p2 = s.worker(checkpoints["ouro"], "prefill2", "--role", "prefill")
        await asyncio.sleep(0.5)  # (the decode node's discovery sees it gone)
        refused = 0
        while True:  # the same prompt, until the new prefill node serves it
            try:
                again = await client.completions.create(model=s.model, prompt=prompt, **kw)
                break
            except openai.InternalServerError as e:
                # (the first while p drains)
                assert e.status_code == 503 and (refused or p.poll() is None)
                assert p2.poll() is None and time.monotonic() - t0 < 90, open(
                    s.log("prefill2")
                ).read()[-3000:]
                refused += 1
                await asyncio.sleep(0.5)
        first = await held
        assert time.monotonic() - t0 > SLOW_S and refused > 0
        assert p.wait(30) == 0 and not _group_alive(p.pid)
        with open(s.log("prefill")) as f:
            log = f.read()
        assert "0 prefills still held after the drain" in log and "1 prompts prefilled" in log, log[
            -3000:
        ]
        tokens = [r.model_extra["nvext"]["completion_token_ids"] for r in (first, again)]
        assert tokens[0] == tokens[1] and len(tokens[0]) == 9, tokens
        _stop(d)
        _stop(p2)
        assert "1 prompts prefilled" in open(s.log("prefill2")).read()
        assert_clean_exit(s.log("decode"))


async def test_clients_leaving_at_any_phase_leave_nothing_behind(checkpoints, stack):
    """Streams through a prefill node and a decode node, a third of whose clients close them at
    random points (while the prompt is prefilled, as the KV moves, while decoding): the others
    finish whole, and the decode node stops with no live request and every block free."""
    with stack() as s:
        p = s.worker(checkpoints["ouro"], "prefill", "--role", "prefill")
        d = s.worker(checkpoints["ouro"], "decode", "--role", "decode")
        s.wait_model(d, "decode")
        client = openai.AsyncOpenAI(base_url=s.url, api_key="none", max_retries=0, timeout=60)

        async def one(i):
            stream = await client.completions.create(
                model=s.model,
                prompt=[5 + (i * 13 + j) % 300 for j in range(10 + 7 * (i % 9))],
                max_tokens=40,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            n = 0
            async for chunk in stream:
                n += sum(1 for c in chunk.choices if c.text is not None)
                if i % 3 == 0 and n > i % 7:
                    await stream.close()  # this client leaves
                    return None
            return chunk.choices[-1].finish_reason

        ends = await asyncio.gather(*(one(i) for i in range(24)))
        assert ends.count("length") == 16 and ends.count(None) == 8
        await asyncio.sleep(1.0)  # (cancellations reach the nodes)
        _stop(d)
        _stop(p)
        assert_clean_exit(s.log("decode"))


def test_a_decode_node_refuses_a_prefill_node_of_another_model(checkpoints, stack):
    """Fingerprints (config, weights, dtype, KV layout) are compared before any KV moves: a decode
    node whose prefill node runs another checkpoint does not start, and says why."""
    with stack() as s:
        p = s.worker(checkpoints["nanbeige"], "prefill", "--role", "prefill")
        d = s.worker(checkpoints["ouro"], "decode", "--role", "decode")
        assert d.wait(120) != 0
        with open(s.log("decode")) as f:
            text = f.read()
        assert "fingerprint" in text and "differs" in text, text[-2000:]
        assert p.poll() is None  # the prefill node keeps serving


def test_bad_options_fail_before_starting(checkpoints):
    r = subprocess.run(
        [sys.executable, "-m", "rlt.dynamo", checkpoints["ouro"], "--max-num-seqs", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "max_num_seqs" in r.stderr, (
        r.stderr
    )
