"""prompt_logprobs: the model's raw logprobs of each prompt token at full depth, equal to the output
logprobs of the same tokens generated greedily; in chunks, after preemption, with the prefix cache,
through rlt.Engine single and prefill/decode."""

import msgspec
import pytest

import rlt
from rlt import SamplingParams
from rlt.contract.validation import resolve_params
from tests.helpers import FAST_PD, OV, SMALL
from tests.workers.helpers import PROMPTS, make, run, spy_preemptions

# float32, other GEMM shapes (see test_engine)
TOL = {"ouro": 1e-4, "nanbeige": 1e-4, "huginn": 1e-3}


def greedy(family, max_tokens=8, **kw) -> SamplingParams:
    """Greedy at full depth (the depth prompt positions run at), with output logprobs."""
    fixed = dict(exit_threshold=1.0) if family == "ouro" else {}
    return SamplingParams(
        max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=4, **fixed, **kw
    )


def first_outputs(engine, mc, requests: dict) -> dict:
    """{id: (prompt, SamplingParams)} run to the end -> {id: its first StepOutput}."""
    for rid, (prompt, sp) in requests.items():
        engine.add_request(rid, prompt, resolve_params(mc, len(prompt), sp))
    firsts = {}
    while engine.has_work():
        for o in engine.step():
            firsts.setdefault(o.request_id, o)
    return firsts


def check_against(generated, plp, start: int, k: int, tol: float) -> None:
    """The prompt logprobs from position `start` on are those the generated tokens came with: the
    same values, the top-k keys and the token's own."""
    for i, (tok, _, top, _) in enumerate(generated):
        got = plp[start + i]
        ranked = sorted(top, key=top.get, reverse=True)[:k]
        assert set(got) == set(ranked) | {tok}, (i, got, top)
        assert max(abs(got[t] - top[t]) for t in got) < tol


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_prompt_logprobs_equal_the_generated_tokens_logprobs(checkpoints, family):
    """Generate greedily with logprobs, then send prompt + those tokens with prompt_logprobs, in
    chunks of 3 among other requests: the last prompt positions carry the generated tokens'
    logprobs; position 0 is None; K = 0 gives the prompt token's own alone."""
    mc, new_engine = make(checkpoints[family], family)
    prompt = PROMPTS[0]
    gen = run(new_engine(), mc, {"a": (prompt, greedy(family))})["a"]
    full = prompt + [o[0] for o in gen]
    other = SamplingParams(max_tokens=5, temperature=0.8, seed=1, ignore_eos=True)
    firsts = first_outputs(
        new_engine(prefill_chunk=3),
        mc,
        {
            "k2": (full, greedy(family, max_tokens=1, prompt_logprobs=2)),
            "k0": (full, greedy(family, max_tokens=1, prompt_logprobs=0)),
            "x": (PROMPTS[1], other),
            "none": (full, greedy(family, max_tokens=1)),
        },
    )
    plp = firsts["k2"].prompt_logprobs
    assert len(plp) == len(full) and plp[0] is None
    assert all(len(d) in (2, 3) and full[j] in d for j, d in enumerate(plp) if j)
    check_against(gen, plp, len(prompt), 2, TOL[family])
    k0 = firsts["k0"].prompt_logprobs
    assert [None if d is None else list(d) for d in k0] == [None] + [[t] for t in full[1:]]
    assert all(abs(k0[j][full[j]] - plp[j][full[j]]) < TOL[family] for j in range(1, len(full)))
    assert firsts["none"].prompt_logprobs is None and firsts["x"].prompt_logprobs is None


def test_prompt_logprobs_take_no_prefix_hits_but_leave_their_blocks(checkpoints):
    """A prompt already cached is computed again when its prompt logprobs are asked (every position
    must run; num_cached_tokens 0) and gives the same values; its blocks serve the next request."""
    mc, new_engine = make(checkpoints["ouro"], "ouro")
    engine = new_engine()
    prompt = [(5 * i + 3) % 500 for i in range(30)]
    asks = greedy("ouro", max_tokens=2, prompt_logprobs=3)
    one = first_outputs(engine, mc, {"a": (prompt, asks)})["a"]
    two = first_outputs(engine, mc, {"b": (prompt, asks)})["b"]
    assert one.num_cached_tokens == two.num_cached_tokens == 0
    assert two.prompt_logprobs == one.prompt_logprobs  # (the same rows in the same passes)
    plain = first_outputs(engine, mc, {"c": (prompt, greedy("ouro", max_tokens=2))})["c"]
    assert plain.num_cached_tokens >= 28


def test_prompt_logprobs_survive_preemption_mid_prompt(checkpoints):
    """A long prompt preempted in the middle (two older requests grow into a small pool) is resumed
    by recompute from its start: its prompt logprobs are whole, once per position, as without."""
    mc, new_engine = make(checkpoints["ouro"], "ouro", prefill_chunk=4)
    prompt = [(7 * i + 11) % 500 + 3 for i in range(40)]
    reqs = {r: ([3, 4, 5], greedy("ouro", max_tokens=20)) for r in "ab"}
    reqs["c"] = (prompt, greedy("ouro", max_tokens=3, prompt_logprobs=1))
    alone = first_outputs(new_engine(), mc, {"c": reqs["c"]})["c"].prompt_logprobs
    # a and b (1 block a plane each) and c's prompt (11), then a and b grow
    engine = new_engine(num_blocks=4 * 16)
    seen = spy_preemptions(engine)
    got = first_outputs(engine, mc, reqs)["c"].prompt_logprobs
    assert 0 in seen  # c, preempted before its first token
    assert len(got) == len(prompt) and [list(d or {}) for d in got] == [
        list(d or {}) for d in alone
    ]
    assert all(abs(a[t] - b[t]) < 1e-4 for a, b in zip(got[1:], alone[1:]) for t in a)


@pytest.mark.parametrize("family", ["ouro", "huginn"])
async def test_prompt_logprobs_through_the_engine_single_and_pd(checkpoints, family):
    """rlt.Engine: a long prompt in several chunks and passes (max_num_batched_tokens 8) carries
    its prompt logprobs on its first output, equal to the greedy continuation's logprobs, in single
    and 1p1d (computed by the prefill worker, riding on the first token it streams). (The greedy
    continuation is generated first on the single engine: a prompt asking for prompt logprobs takes
    no prefix-cache hit, test_prompt_logprobs_take_no_prefix_hits_but_leave_their_blocks.)"""
    prompt = [(13 * i + 2) % 500 for i in range(40)]
    opts = dict(max_num_batched_tokens=8)
    asks = msgspec.structs.replace(greedy(family, max_tokens=2), prompt_logprobs=3)
    for topology in ("single", "1p1d"):
        async with rlt.Engine.launch(
            checkpoints[family],
            topology=topology,
            hf_overrides=OV.get(family),
            **(SMALL | FAST_PD | opts),
        ) as engine:
            if topology == "single":
                async for gen in engine.generate(prompt, greedy(family)):
                    pass
                tokens, top = gen.token_ids, gen.logprobs
                full = prompt + tokens
            outs = [o async for o in engine.generate(full, asks)]
            assert engine.stats().local_prefills == 0  # 1p1d: the prefill worker computed them
        assert all(o.prompt_logprobs is not None for o in outs)  # from the first output on
        plp = outs[-1].prompt_logprobs
        assert (
            len(plp) == len(full)
            and plp[0] is None
            and outs[-1].to_json()["prompt_logprobs"][0] is None
        )
        check_against(
            [(t, None, lp, None) for t, lp in zip(tokens, top)], plp, len(prompt), 3, TOL[family]
        )
