"""`rlt serve` as a real subprocess on a free localhost port, driven by the official `openai` client
(sync and async): outputs equal the Python API's for the same request, streaming, n, stop strings,
errors in OpenAI's shape."""

import asyncio
import subprocess
import sys
import time

import openai
import pytest

import rlt
from rlt import SamplingParams
from rlt.models.tokenizer import load_tokenizer
from tests.helpers import HUGINN
from tests.serve.helpers import free_port, scrape, serving


@pytest.fixture
def ouro(ouro_server):
    return ouro_server  # (conftest.py: one server for the session)


async def python_api(model, prompt, sp, hf_overrides=None):
    async with rlt.Engine.launch(model, hf_overrides=hf_overrides, heartbeat_timeout=3.0) as engine:
        async for out in engine.generate(prompt, sp):
            pass
        return out, engine.tokenizer


def test_completion_equals_the_python_api(checkpoints, ouro):
    client = openai.OpenAI(base_url=ouro, api_key="none")
    prompt = [5, 6, 7, 8, 9, 10, 11]
    extra = {"return_exit_depths": True, "return_token_ids": True}
    r = client.completions.create(
        model="m", prompt=prompt, max_tokens=10, temperature=0, extra_body=extra
    )
    sp = SamplingParams(max_tokens=10, temperature=0)
    out, _ = asyncio.run(python_api(checkpoints["ouro"], prompt, sp))
    c = r.choices[0]
    assert (c.text, c.model_extra["exit_depths"], c.finish_reason) == (
        out.text,
        out.exit_depths,
        out.finish_reason,
    )
    assert (c.model_extra["token_ids"], c.model_extra["prompt_token_ids"]) == (
        out.token_ids,
        prompt,
    )
    stream = client.completions.create(
        model="m", prompt=prompt, max_tokens=10, temperature=0, stream=True, extra_body=extra
    )
    chunks = [c.model_extra for chunk in stream for c in chunk.choices]
    assert [i for c in chunks for i in c["token_ids"]] == out.token_ids
    assert [d for c in chunks for d in c["exit_depths"]] == out.exit_depths
    assert chunks[0]["prompt_token_ids"] == prompt and all(
        "prompt_token_ids" not in c for c in chunks[1:]
    )
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (7, len(out.token_ids))
    assert [m.id for m in client.models.list().data] == ["m"]


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_chat_equals_generate_on_the_rendered_conversation(checkpoints, served, family):
    """The checkpoint's own template with the assistant's turn opened, one BOS at most."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where does the river run?"},
        {"role": "assistant", "content": "To the sea."},
        {"role": "user", "content": "And then?"},
    ]
    ov = HUGINN if family == "huginn" else None  # (as its server: conftest.served)
    r = openai.OpenAI(base_url=served(family), api_key="none").chat.completions.create(
        model="m",
        messages=messages,
        max_completion_tokens=12,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    tok = load_tokenizer(checkpoints[family])
    raw = tok(
        tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ).input_ids
    bos = tok.bos_token_id
    ids = raw[1:] if bos is not None and raw[:2] == [bos, bos] else raw
    # their templates write the BOS the tokenizer adds
    assert (len(raw) - len(ids)) == (family != "ouro")
    want, _ = asyncio.run(
        python_api(checkpoints[family], ids, SamplingParams(max_tokens=12, temperature=0), ov)
    )
    m = r.choices[0].message
    # its template opens <think>: the text (never closed here) is the reasoning
    if family == "nanbeige":
        assert tok.convert_tokens_to_ids("</think>") not in want.token_ids
        assert (m.model_extra["reasoning_content"], m.content) == (want.text or None, "")
    else:
        assert m.content == want.text
    assert m.role == "assistant"
    assert (r.model_extra["prompt_token_ids"], r.choices[0].model_extra["token_ids"]) == (
        ids,
        want.token_ids,
    )
    assert r.usage.prompt_tokens == len(ids)


async def test_streaming_n_and_stop_strings(ouro):
    client = openai.AsyncOpenAI(base_url=ouro, api_key="none")
    whole = await client.completions.create(
        model="m", prompt="The river runs", max_tokens=12, temperature=0
    )
    text = whole.choices[0].text
    pieces, usage = [], None
    stream = await client.completions.create(
        model="m",
        prompt="The river runs",
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        pieces += [c.text for c in chunk.choices]
        usage = chunk.usage or usage
    assert "".join(pieces) == text and usage.completion_tokens == 12
    # n: each choice its own seed stream (seed, seed + 1), as separate requests give
    two = await client.completions.create(model="m", prompt="The river", max_tokens=8, n=2, seed=5)
    one = [
        (await client.completions.create(model="m", prompt="The river", max_tokens=8, seed=s))
        .choices[0]
        .text
        for s in (5, 6)
    ]
    assert [c.text for c in sorted(two.choices, key=lambda c: c.index)] == one
    # a stop string: the text ends before it, finish_reason "stop", streamed or not
    stop = text[3:5]
    cut = text[: text.find(stop)]
    r = await client.completions.create(
        model="m", prompt="The river runs", max_tokens=12, temperature=0, stop=stop
    )
    assert (r.choices[0].text, r.choices[0].finish_reason) == (cut, "stop")
    stream = await client.completions.create(
        model="m", prompt="The river runs", max_tokens=12, temperature=0, stop=[stop], stream=True
    )
    got = [(c.text, c.finish_reason) async for chunk in stream for c in chunk.choices]
    assert "".join(t for t, _ in got) == cut and got[-1][1] == "stop"


def test_errors_in_openai_shape(ouro, checkpoints):
    client = openai.OpenAI(base_url=ouro, api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="x", max_tokens=-1)
    assert (
        e.value.body["message"] == "max_tokens must be >= 1, got -1"
        and e.value.body["param"] == "max_tokens"
    )
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], temperature=-2
        )
    with pytest.raises(openai.NotFoundError, match="the model 'other' does not exist"):
        client.completions.create(model="other", prompt="x")
    r = client.completions.create(model="m", prompt="still serving", max_tokens=2)
    assert r.choices[0].finish_reason == "length"
    with serving(checkpoints["ouro"], "--api-key", "k1") as url:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        assert openai.OpenAI(base_url=url, api_key="k1").models.list().data[0].id == "m"


def test_bad_options_fail_before_serving(checkpoints):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlt",
            "serve",
            checkpoints["ouro"],
            "--port",
            str(free_port()),
            "--num-blocks",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "num_blocks must be an integer >= 1, got 0" in r.stderr


async def test_disconnected_clients_abort_and_metrics_count(ouro):
    """Clients that go away mid-stream abort their requests at once (nothing left running, every KV
    block free); /metrics counts tokens, exit depths, latencies and the aborts."""
    client = openai.AsyncOpenAI(base_url=ouro, api_key="none")
    before = scrape(ouro)

    async def leave_after(k):
        stream = await client.completions.create(
            model="m",
            prompt="The river",
            max_tokens=20000,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        async for _ in stream:
            k -= 1
            if k == 0:
                break
        await stream.close()

    await asyncio.gather(*(leave_after(k) for k in (1, 2, 5, 10)))
    r = await client.completions.create(
        model="m", prompt="still serving", max_tokens=3, temperature=0
    )
    assert r.choices[0].finish_reason == "length"
    deadline = time.monotonic() + 10
    while (m := scrape(ouro))["rlt:num_requests_running"] or m["rlt:kv_cache_usage_perc"]:
        assert time.monotonic() < deadline, m
        await asyncio.sleep(0.05)
    grew = {k: m[k] - before.get(k, 0) for k in m}
    assert grew['rlt:request_success_total{finished_reason="abort"}'] == 4
    assert grew['rlt:request_success_total{finished_reason="length"}'] == 1
    assert grew["rlt:generation_tokens_total"] >= 1 + 2 + 5 + 10 + 3
    assert grew["rlt:exit_depth_count"] == grew["rlt:generation_tokens_total"]
    assert (
        grew["rlt:time_to_first_token_seconds_count"] == 5
        and grew["rlt:e2e_request_latency_seconds_count"] == 5
    )
    assert m["rlt:num_preemptions_total"] == 0 and m["rlt:kv_handoff_bytes_total"] == 0


def test_cached_prompt_tokens_in_usage_and_metrics(ouro):
    """A prompt sent again is served from the prefix cache: usage.prompt_tokens_details.cached_tokens
    (streamed or not) says how many of its tokens, and /metrics counts them."""
    client = openai.OpenAI(base_url=ouro, api_key="none")
    prompt, before = list(range(400, 440)), scrape(ouro)
    first = client.completions.create(model="m", prompt=prompt, max_tokens=2, temperature=0)
    again = client.completions.create(model="m", prompt=prompt + [7], max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == 32  # whole 16-position blocks
    stream = client.completions.create(
        model="m",
        prompt=prompt,
        max_tokens=2,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [chunk.usage for chunk in stream if chunk.usage is not None]
    # (its last position is recomputed)
    assert [u.prompt_tokens_details.cached_tokens for u in usage] == [32]
    m = scrape(ouro)
    assert m["rlt:prefix_cache_hits_total"] - before.get("rlt:prefix_cache_hits_total", 0) == 64
    assert (
        m["rlt:prefix_cache_queries_total"] - before.get("rlt:prefix_cache_queries_total", 0)
        == 40 + 41 + 40
    )
    assert m["rlt:prefix_cache_blocks"] > 0


def test_logprobs_equal_the_python_api(checkpoints, ouro):
    """Completions' tokens / token_logprobs / top_logprobs and chat's content entries carry the
    engine's logprobs: the sampled token's own and the top ones, sampled or greedy."""
    client = openai.OpenAI(base_url=ouro, api_key="none")
    prompt = [5, 6, 7, 8, 9, 10, 11]
    r = client.completions.create(
        model="m", prompt=prompt, max_tokens=6, temperature=0.9, seed=3, logprobs=2
    )
    out, tok = asyncio.run(
        python_api(
            checkpoints["ouro"],
            prompt,
            SamplingParams(max_tokens=6, temperature=0.9, seed=3, logprobs=2),
        )
    )
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == [pos[t] for t, pos in zip(out.token_ids, out.logprobs)]
    assert lp.tokens == [tok.decode([t]) for t in out.token_ids]
    for top, pos in zip(lp.top_logprobs, out.logprobs):
        best = sorted(pos.values(), reverse=True)[:2]
        assert len(top) == 2 and sorted(top.values(), reverse=True) == best
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    c = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=3,
    )
    content = c.choices[0].logprobs.content
    assert len(content) == 4 and all(len(e.top_logprobs) == 3 for e in content)
    assert all(e.logprob <= 0 and e.top_logprobs[0].logprob >= e.logprob for e in content)


async def test_a_thousand_streams_with_a_tenth_of_clients_leaving(ouro):
    """1,000 streamed requests, 64 at a time; one in ten clients leaves at a random point. Every other
    request completes, and afterwards nothing runs and every KV block is free."""
    import random

    client = openai.AsyncOpenAI(base_url=ouro, api_key="none", max_retries=0, timeout=60)
    rng, gate = random.Random(0), asyncio.Semaphore(64)

    async def one(i):
        leave = rng.randint(1, 8) if i % 10 == 3 else None
        async with gate:
            stream = await client.completions.create(
                model="m",
                prompt=f"request {i}",
                max_tokens=8,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            pieces, finish = 0, None
            async for chunk in stream:
                pieces += 1
                finish = chunk.choices[0].finish_reason if chunk.choices else finish
                if pieces == leave:
                    await stream.close()
                    return None
            return finish

    finishes = await asyncio.gather(*(one(i) for i in range(1000)))
    assert [f for i, f in enumerate(finishes) if i % 10 != 3] == ["length"] * 900
    deadline = time.monotonic() + 10
    while (m := scrape(ouro))["rlt:num_requests_running"] or m["rlt:kv_cache_usage_perc"]:
        assert time.monotonic() < deadline, m
        await asyncio.sleep(0.05)


def test_defaults_from_generation_config(checkpoints, tmp_path):
    """Fields a request leaves out come from generation_config.json (here greedy, 5 tokens), and
    --override-generation-config goes over them."""
    import json
    import shutil

    model = shutil.copytree(checkpoints["ouro"], tmp_path / "ouro")
    (model / "generation_config.json").write_text(
        json.dumps({"temperature": 0.0, "max_new_tokens": 5})
    )
    with serving(str(model)) as url:
        client = openai.OpenAI(base_url=url, api_key="none")
        a, b = (client.completions.create(model="m", prompt="The river") for _ in range(2))
        # greedy, 5 tokens
        assert a.choices[0].text == b.choices[0].text and a.usage.completion_tokens == 5
    with serving(str(model), "--override-generation-config", '{"max_new_tokens": 3}') as url:
        r = openai.OpenAI(base_url=url, api_key="none").completions.create(
            model="m", prompt="The river"
        )
        assert r.usage.completion_tokens == 3


async def test_the_serving_benchmark_over_http_counts_what_the_python_api_generates(
    checkpoints, ouro
):
    """`rlt bench serve --base-url`: the same workload and metrics as in process."""
    from rlt.bench.serving import EngineTarget, HTTPTarget, closed_loop, one_rate

    http = HTTPTarget(ouro, "m", vocab_size=256)
    rows = [
        await closed_loop(http, 3, 7, [5, 40], 6, seed=1),
        await one_rate(http, 20.0, 0.3, [9], 4, seed=2),
    ]
    assert [r["completed"] for r in rows] == [7, len(rows[1]["requests"])] and rows[1][
        "completed"
    ] >= 1
    assert (
        rows[0]["concurrency"] == 3
        and sorted(n for n, *_ in rows[0]["requests"]) == [5] * 4 + [40] * 3
    )
    # every token counted once: ignore_eos, token ids per chunk
    for row, out_len in zip(rows, (6, 4)):
        assert row["total_output_tokens"] == row["completed"] * out_len
        # (tpot is 0 when a busy machine delivers a request's later tokens with its first: one
        # output)
        assert all(ttft > 0 and tpot >= 0 for _, ttft, tpot in row["requests"])
    async with rlt.Engine.launch(checkpoints["ouro"], heartbeat_timeout=3.0) as engine:
        local = await closed_loop(EngineTarget(engine), 3, 7, [5, 40], 6, seed=1)
        # a ramp: the third client's one request starts 2 * 1.5 / 3 s after the first one's
        ramped = await closed_loop(EngineTarget(engine), 3, 3, [5], 2, seed=1, ramp_s=1.5)
    assert local.keys() == rows[0].keys() and local["completed"] == 7 and rows[0]["ramp_s"] == 0.0
    assert ramped["completed"] == 3 and ramped["ramp_s"] == 1.5 and ramped["duration_s"] >= 1.0, (
        ramped
    )
