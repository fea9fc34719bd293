"""Looped self-speculation (rlt/workers/speculation.py): a request's first loops draft, its last
verify; its stream equals the plain one token for token (ids, exit depths, logprobs, finish), greedy
and sampled, at low and high acceptance, with preemption, prefix hits, stop tokens, max_tokens, n > 1
and 1p1d; where it cannot run (adaptive exit, penalties, grammars) the engine does not speculate."""

import asyncio
import urllib.request

import msgspec
import openai
import pytest
import torch

import rlt
from rlt import RequestError, SamplingParams
from rlt.contract.config import EngineConfig
from rlt.contract.validation import resolve_params
from rlt.models.checkpoint import make_checkpoint
from rlt.models.loader import load_model
from rlt.models.model_config import ModelConfig
from rlt.workers.engine import LoopEngine
from tests.helpers import FAST_PD, OV, SMALL, all_free

# update_scale of the test checkpoints by acceptance: random weights (~0) and small loop updates
# (high)
SCALES = {
    "ouro": {"low": 1.0, "high": 0.01},
    "nanbeige": {"low": 1.0, "high": 0.05},
    "huginn": {"low": 1.0, "high": 0.01},
}
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [3, 4], [100, 200, 300, 400, 500, 6, 7]]


@pytest.fixture(scope="module")
def spec_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    return {
        (family, level): make_checkpoint(
            family, str(root / f"{family}-{level}"), seed=1, update_scale=scale
        )
        for family, levels in SCALES.items()
        for level, scale in levels.items()
    }


def params(max_tokens=20, **kw):
    return [
        SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=3, **kw),
        SamplingParams(
            max_tokens=max_tokens - 3, temperature=1.0, seed=3, ignore_eos=True, logprobs=2, **kw
        ),
        SamplingParams(
            max_tokens=max_tokens + 2,
            temperature=0.7,
            top_k=20,
            top_p=0.9,
            seed=5,
            ignore_eos=True,
            **kw,
        ),
    ]


def engine(path, **cfg):
    mc = ModelConfig.from_pretrained(
        path, hf_overrides=OV.get("huginn") if "huginn" in path else None
    )
    model = load_model(mc, torch.float32)
    cfg = {"block_size": 4, "num_blocks": 600, "prefill_chunk": 5} | cfg
    return mc, LoopEngine(mc, model, EngineConfig(**cfg), torch.float32)


def run(mc, eng, requests, arrivals=None):
    """{id: (prompt, SamplingParams)} -> {id: [(token, depth, logprobs, finish)]}, every block back."""
    arrivals = arrivals or {}
    out, step, added = {r: [] for r in requests}, 0, set()
    while len(added) < len(requests) or eng.has_work():
        for rid, (prompt, sp) in requests.items():
            if rid not in added and arrivals.get(rid, 0) <= step:
                eng.add_request(rid, prompt, resolve_params(mc, len(prompt), sp))
                added.add(rid)
        for o in eng.step():
            out[o.request_id].append((o.token_id, o.exit_depth, o.logprobs, o.finish_reason))
        step += 1
        assert step < 3000
    assert eng.pool.num_free == eng.pool.num_blocks  # (cached blocks free: held by no request)
    return out


def assert_same(plain, spec):
    for rid in plain:
        # ids and finish reasons
        assert [o[0::3] for o in plain[rid]] == [o[0::3] for o in spec[rid]], rid
        assert [o[1] for o in plain[rid]] == [o[1] for o in spec[rid]], rid  # exit depths
        for (_, _, a, _), (_, _, b, _) in zip(plain[rid], spec[rid]):
            if a is not None:
                assert a.keys() == b.keys() and max(abs(a[k] - b[k]) for k in a) < 1e-4


@pytest.mark.parametrize("level", ["low", "high"])
@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_speculative_equals_plain(spec_checkpoints, family, level):
    """Every draft depth (Huginn: 1, 3, 5 of 6 recurrences; its coda runs on the drafts' states and
    writes their positions' boundary K/V, which the verify writes again before a later position
    reads them at full depth), rounds of 1, 3 and 6 checked drafts."""
    path = spec_checkpoints[(family, level)]
    reqs = {str(i): (p, sp) for i, (p, sp) in enumerate(zip(PROMPTS, params()))}
    mc, plain_engine = engine(path)
    plain = run(mc, plain_engine, reqs, arrivals={"1": 2, "2": 5})
    for loops in (1, 3, 5) if family == "huginn" else range(1, mc.depth):
        for tokens in (1, 3, 6) if loops == 1 else (6,):
            _, eng = engine(path, speculative_loops=loops, speculative_tokens=tokens)
            spec = run(mc, eng, reqs, arrivals={"1": 2, "2": 5})
            assert_same(plain, spec)
            assert eng.spec_drafts > 0
            acceptance = eng.spec_accepted / eng.spec_drafts
            # (drafts of more loops agree more often, even at random)
            if loops == 1 and level == "high":
                assert acceptance > 0.7, (tokens, acceptance)
            if loops == 1 and level == "low":  # rounds that do not pay pause it: 8, 16, 32 tokens
                assert eng.spec_rounds <= 4 * len(reqs), eng.spec_rounds


@pytest.mark.parametrize("level", ["low", "high"])
def test_passes_against_plain(spec_checkpoints, level):
    """One stream of 80 tokens: at acceptance near 1 a round of 3 checked drafts (one loop each) and
    a verify (three loops) gives up to 4 tokens, fewer passes than 4 loops a token; near 0 the
    request soon stops drafting and costs about what plain decoding does."""
    path = spec_checkpoints[("ouro", level)]
    req = {"0": (PROMPTS[0], SamplingParams(max_tokens=80, temperature=0, ignore_eos=True))}
    passes = {}
    for loops in (0, 1):
        mc, eng = engine(path, speculative_loops=loops, speculative_tokens=3)
        run(mc, eng, req)
        passes[loops] = eng.passes
    assert passes[1] < 0.6 * passes[0] if level == "high" else passes[1] < 1.1 * passes[0], passes


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_preemption_prefix_hits_stops_and_max_tokens(spec_checkpoints, family):
    """A pool too small for every request at once (preemption mid-round), a prompt repeated (its
    blocks cached), stop token ids hit mid-round, max_tokens that end rounds early."""
    path = spec_checkpoints[(family, "high")]
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    plain_run = run(*engine(path), {"warm": (PROMPTS[0], greedy)})
    stop = plain_run["warm"][6][0]  # a token the greedy stream outputs mid-way
    sps = params(max_tokens=24) + [msgspec.structs.replace(greedy, stop_token_ids=[stop])]
    reqs = {str(i): (PROMPTS[i % 3], sp) for i, sp in enumerate(sps)}
    reqs |= {f"{rid}b": req for rid, req in reqs.items()}  # the same prompts again: prefix hits
    arrivals = {rid: 6 if rid.endswith("b") else 0 for rid in reqs}
    blocks = {"ouro": 90, "nanbeige": 44, "huginn": 150}[family]  # (4, 2 and 7 planes)
    mc, plain_engine = engine(path, num_blocks=blocks)
    plain = run(mc, plain_engine, reqs, arrivals)
    _, eng = engine(path, num_blocks=blocks, speculative_loops=1, speculative_tokens=4)
    spec = run(mc, eng, reqs, arrivals)
    assert_same(plain, spec)
    assert eng.preemptions > 0 and eng.spec_accepted > 0
    assert spec["3"][-1][3] == "stop" and len(spec["3"]) == 7
    # (its KV depends on each one's seed)
    assert eng.pool.prefix.hit_tokens > 0 or family == "huginn"


def test_no_speculation_where_it_cannot_run(spec_checkpoints):
    """Adaptive exit and penalties run plain on a speculating engine (the engine's default leaves
    them out); asking for it on such a request is refused, naming why."""
    path = spec_checkpoints[("ouro", "high")]
    sps = [
        SamplingParams(max_tokens=10, temperature=0, exit_threshold=0.5),
        SamplingParams(max_tokens=10, temperature=0, repetition_penalty=1.2),
        SamplingParams(max_tokens=10, temperature=0, speculative_loops=0),
    ]
    reqs = {str(i): (PROMPTS[i], sp) for i, sp in enumerate(sps)}
    mc, plain_engine = engine(path)
    plain = run(mc, plain_engine, reqs)
    _, eng = engine(path, speculative_loops=2)
    assert_same(plain, run(mc, eng, reqs))
    assert eng.spec_drafts == 0
    for bad, why in (
        (dict(exit_threshold=0.5), "exit early"),
        (dict(presence_penalty=0.5), "a penalty"),
    ):
        with pytest.raises(RequestError, match=f"speculative_loops 1: .*this request has {why}"):
            resolve_params(mc, 3, SamplingParams(speculative_loops=1, **bad))
    with pytest.raises(
        RequestError, match=r"speculative_loops must be <= max_loops - 1 \(1\), got 2"
    ):
        resolve_params(mc, 3, SamplingParams(speculative_loops=2, max_loops=2))
    with pytest.raises(RequestError, match="speculative_tokens must be <= 16, got 17"):
        resolve_params(mc, 3, SamplingParams(speculative_tokens=17))


async def test_launch_refuses_speculation_at_the_whole_depth(checkpoints):
    with pytest.raises(ValueError, match="speculative_loops 4 must be below the model's depth 4"):
        rlt.Engine.launch(checkpoints["ouro"], speculative_loops=4)


async def generate_all(path, topology, reqs, **opts):
    ov = OV["huginn"] if "huginn" in path else None
    async with rlt.Engine.launch(
        path, topology=topology, hf_overrides=ov, **(SMALL | FAST_PD | opts)
    ) as eng:

        async def one(i, prompt, sp):
            last = {}  # choice -> its last (cumulative) output
            async for out in eng.generate(prompt, sp, request_id=f"r{i}"):
                last[out.index] = out
            return [
                (o.token_ids, o.exit_depths, o.finish_reason, o.text)
                for _, o in sorted(last.items())
            ]

        got = await asyncio.gather(*(one(i, p, sp) for i, (p, sp) in enumerate(reqs)))
        await all_free(eng)
        return got, eng.stats()


async def test_structured_output_masks_drafts_and_verify(spec_checkpoints):
    """Grammars on a speculating engine (a JSON schema, a regex, choices, and a grammar that starts
    after a token: plain until then): every output as without speculation, each valid, drafts taken."""
    path = spec_checkpoints[("ouro", "high")]
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
        "required": ["a"],
    }
    kinds = [
        rlt.StructuredOutput(json=schema),
        rlt.StructuredOutput(regex="(ab|cd)[0-9]{3,9}x"),
        rlt.StructuredOutput(choice=["river", "mountain", "sea"]),
        rlt.StructuredOutput(regex="[a-z ]{4,40}", after=[PROMPTS[1][0]]),
    ]
    reqs = [
        (PROMPTS[i % 3], SamplingParams(max_tokens=40, temperature=t, seed=i, structured_output=so))
        for i, so in enumerate(kinds)
        for t in (0.0, 0.9)
    ]
    plain, _ = await generate_all(path, "single", reqs)
    spec, stats = await generate_all(
        path, "single", reqs, speculative_loops=1, speculative_tokens=3
    )
    assert spec == plain
    assert sum(w.spec_draft_tokens for w in stats.workers) > 0


_PLAIN: dict = {}  # family -> (requests, their stop string, outputs without speculation)


@pytest.mark.parametrize("topology", ["single", "1p1d"])
@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
async def test_engine_api_speculates_with_n_stop_strings_and_in_pd(
    spec_checkpoints, family, topology
):
    """Through rlt.Engine: n = 3 choices, a stop string met mid-way, a per-request opt-out, and the
    PD decode worker drafting; every choice equals the engine's without speculation, and the stats
    count the drafts."""
    path = spec_checkpoints[(family, "high")]
    if family not in _PLAIN:  # (the reference, once per family: both topologies compare with it)
        greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
        text = (await generate_all(path, "single", [(PROMPTS[1], greedy)]))[0][0][0][3]
        stop = text[len(text) // 2 :][:2]  # (a string the greedy text holds past its start)
        reqs = [
            (
                PROMPTS[0],
                SamplingParams(max_tokens=15, temperature=0.8, seed=7, n=3, ignore_eos=True),
            ),
            (PROMPTS[1], msgspec.structs.replace(greedy, stop=[stop])),
            (PROMPTS[2], msgspec.structs.replace(greedy, speculative_loops=0)),
        ]
        _PLAIN[family] = reqs, stop, (await generate_all(path, "single", reqs))[0]
    reqs, stop, plain = _PLAIN[family]
    spec, stats = await generate_all(
        path, topology, reqs, speculative_loops=1, speculative_tokens=3
    )
    assert spec == plain
    assert len(plain[0]) == 3 and plain[1][0][2] == "stop" and stop not in plain[1][0][3]
    drafts = sum(w.spec_draft_tokens for w in stats.workers)
    accepted = sum(w.spec_accepted_tokens for w in stats.workers)
    assert drafts > 0 and accepted / drafts > 0.7, (drafts, accepted)


def test_rlt_serve_takes_speculation_per_request(served):
    """`rlt serve` (the tiny Ouro, no speculation by default): a request's speculative_loops turns
    it on for that request (the same tokens), /metrics counts its drafts, and a request it cannot
    run for is a 400 naming the field."""
    url = served("ouro")
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)

    def ids(**extra):
        body = {"return_token_ids": True, "ignore_eos": True} | extra
        r = client.completions.create(
            model="m", prompt=PROMPTS[0], max_tokens=14, temperature=0, extra_body=body
        )
        return r.choices[0].model_extra["token_ids"]

    before = _metric(url, "rlt:spec_decode_num_draft_tokens_total")
    assert ids(speculative_loops=2, speculative_tokens=3) == ids()
    assert _metric(url, "rlt:spec_decode_num_draft_tokens_total") > before
    with pytest.raises(
        openai.BadRequestError, match="speculative_loops 1: self-speculation needs a fixed depth"
    ):
        ids(speculative_loops=1, exit_threshold=0.5)


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=30) as r:
        lines = r.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{"))


def test_rounds_check_the_drafts_that_give_the_most_tokens_a_loop_pass():
    """At Ouro's depth 4 drafting 1 loop: acceptance 0.9 checks all 6 drafts a round may, 0.7 two,
    0.5 one (1.5 tokens for 5 loop passes: 1.2x); at 0.4 even one draft does not pay by the margin,
    so the request pauses drafting for 8 tokens."""
    from rlt.workers.speculation import Acceptance

    at = {a: Acceptance(checked=100.0, matched=100 * a) for a in (0.9, 0.7, 0.5, 0.4)}
    assert [at[a].drafts(6, 1, 4) for a in (0.9, 0.7, 0.5)] == [6, 2, 1]
    at[0.5].update(1, 1, 6, 1, 4, outputs=40)
    assert at[0.5].pause_until == 0
    at[0.4].update(1, 0, 6, 1, 4, outputs=40)
    assert at[0.4].pause_until == 48
