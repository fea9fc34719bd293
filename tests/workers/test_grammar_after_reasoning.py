"""A grammar that starts where the reasoning ends (StructuredOutput.after; as vLLM's structured-output
manager with a reasoning parser): the outputs up to and including the marker are the unconstrained
request's, token for token; the ones after it obey the grammar. The same tokens on every path
(preemption, prefix-cache hits, steady decode beside) and in 1p1d as in single; a resumed matcher
replays to the same state. Served: under a template that opens <think>, a JSON schema or a forced
tool call applies to the content after </think>."""

import json

import jsonschema
import msgspec
import openai
import pytest

from rlt import SamplingParams, StructuredOutput
from rlt.contract.validation import resolve_params
from rlt.errors import RequestError
from rlt.models.tokenizer import load_tokenizer
from tests.workers.helpers import make, run, run_all, spy_preemptions

SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "k": {"enum": ["a", "b"]},
    },
    "required": ["n", "k"],
    "additionalProperties": False,
}
FREE = {  # unconstrained: the reasoning each constrained request starts with
    "two": ([5, 6, 7, 8, 9], SamplingParams(max_tokens=40, temperature=1.0, seed=1)),
    # Ouro: most tokens exit in their first loop, before the token before them is read back
    "early": (
        [3, 9, 27],
        SamplingParams(max_tokens=40, temperature=1.0, seed=2, exit_threshold=0.05),
    ),
    "never": ([4, 4], SamplingParams(max_tokens=10, temperature=0.9, seed=3)),
}


def first_at(out: list[int], start: int, width: int) -> int:
    """The first index >= start where the `width` ids ending there appear for the first time."""
    return next(
        k for k in range(start, len(out)) if out[k - width + 1 : k + 1] not in seen(out[:k], width)
    )


def seen(out: list[int], width: int) -> list[list[int]]:
    return [out[i : i + width] for i in range(len(out) - width + 1)]


def marked(tok_free: dict) -> dict:
    """The constrained workload: `two` waits for a 2-id marker first seen at its output 10 or later,
    `early` for one id first seen at 8 or later, `never` for an id it never outputs -> {id: (prompt,
    params, index of the marker's last token or None)}."""
    reqs = {}
    for r, width, start in (("two", 2, 10), ("early", 1, 8)):
        out = tok_free[r]
        k = first_at(out, start, width)
        reqs[r] = (k, out[k - width + 1 : k + 1])
    reqs["never"] = (None, [next(t for t in range(1, 500) if t not in tok_free["never"])])
    return {r: (FREE[r][0], constrained(FREE[r][1], after), k) for r, (k, after) in reqs.items()}


def constrained(sp: SamplingParams, after: list[int]) -> SamplingParams:
    return msgspec.structs.replace(sp, structured_output=StructuredOutput(json=SCHEMA, after=after))


def check(tok, free: dict, reqs: dict, got: dict) -> None:
    """Up to the marker, the unconstrained tokens and depths; after it, the schema's JSON and "stop"
    (`never`: all of it unconstrained, to max_tokens)."""
    for r, (_, sp, k) in reqs.items():
        if k is None:
            assert got[r] == free[r], r
            continue
        assert got[r][: k + 1] == free[r][: k + 1], r
        text = tok.decode([t for t, _, _ in got[r][k + 1 :]], skip_special_tokens=True)
        jsonschema.validate(json.loads(text), SCHEMA)
        assert got[r][-1][2] == "stop", (r, text)


def outputs(got: dict) -> dict:
    return {r: [(o[0], o[1], o[3]) for o in v] for r, v in got.items()}


@pytest.fixture(scope="module")
def ouro(checkpoints):
    mc, new_engine = make(checkpoints["ouro"], "ouro")
    free = outputs(run(new_engine(steady_decode="never"), mc, FREE))
    return mc, new_engine, free, marked({r: [t for t, _, _ in v] for r, v in free.items()})


def test_the_grammar_starts_after_the_marker_on_every_path(ouro):
    """The marker's tokens and those before it are the unconstrained run's; the rest validate. The
    same with an unconstrained neighbour on steady decode, after preemption (resumed mid-reasoning
    and mid-grammar: the matcher keeps its state) and with prefix-cache hits."""
    mc, new_engine, free, reqs = ouro
    tok = load_tokenizer(mc.path)
    work = {r: (p, sp) for r, (p, sp, _) in reqs.items()}
    base = outputs(run(new_engine(steady_decode="never"), mc, work))
    check(tok, free, reqs, base)
    neighbour = ([5, 6, 7], SamplingParams(max_tokens=30, temperature=1.0, seed=6, ignore_eos=True))
    both = outputs(
        run(
            new_engine(steady_decode="always"), mc, work | {"free": neighbour}, arrivals={"free": 4}
        )
    )
    assert {r: both[r] for r in work} == base
    small = new_engine(num_blocks=1)
    marks = [k for _, _, k in reqs.values() if k is not None]
    for arrivals, resumed in (
        ({}, lambda n: n <= min(marks)),
        ({"early": 3}, lambda n: n > max(marks)),
    ):
        engine = new_engine(
            num_blocks=(small.pool.num_core_planes + int(small.pool.has_boundary)) * 13
        )
        preempted = spy_preemptions(engine)
        assert outputs(run(engine, mc, work, arrivals=arrivals)) == base
        assert any(map(resumed, preempted)), preempted  # resumed mid-reasoning; mid-grammar
    engine = new_engine()
    run(engine, mc, work)
    hits = engine.pool.prefix.hit_tokens
    assert outputs(run(engine, mc, {r + "'": v for r, v in work.items()})) == {
        r + "'": v for r, v in base.items()
    }
    assert engine.pool.prefix.hit_tokens > hits


def test_a_rebuilt_matcher_replays_to_the_same_state(ouro):
    """Constraint built on any prefix of the outputs (a PD decode worker's, a resumed request's)
    equals the one fed token by token: started at the same output, the same mask; a marker matches
    across a repeated first id (a a b) and not across another id (a x b)."""
    import xgrammar as xgr

    from rlt.contract.grammar import spec_of
    from rlt.workers.grammar import Constraint
    from rlt.workers.grammar_zygote import compile_spec, tokenizer_info

    mc, new_engine, free, reqs = ouro
    compiler = xgr.GrammarCompiler(
        tokenizer_info(load_tokenizer(mc.path), mc.vocab_size, mc.eos_token_ids)
    )
    compiled = compile_spec(compiler, spec_of(StructuredOutput(json=SCHEMA)))
    _, sp, k = reqs["two"]
    after = tuple(sp.structured_output.after)
    out = [o[0] for o in run(new_engine(), mc, {"two": (FREE["two"][0], sp)})["two"]]
    fed = Constraint(compiled, [], after)
    for i, t in enumerate(out[:-1]):
        fed.accept(t, i)
        rebuilt = Constraint(compiled, out[: i + 1], after)
        assert (rebuilt.started, rebuilt.accepted) == (fed.started, fed.accepted) == (i >= k, i + 1)
        if fed.started:
            assert (rebuilt.fill() == fed.fill()).all()
    a, b = after
    x = next(t for t in range(500) if t not in after)
    assert (
        Constraint(compiled, [a, a, b], after).started
        and not Constraint(compiled, [a, x, b], after).started
    )


def test_after_is_checked(ouro):
    mc = ouro[0]
    for bad in ([], [-1], [mc.vocab_size], [True], "</think>"):
        sp = SamplingParams(structured_output=StructuredOutput(regex="a", after=bad))
        with pytest.raises(
            RequestError, match=r"^structured_output.after must be a non-empty list of token ids"
        ):
            resolve_params(mc, 3, sp)
    assert resolve_params(mc, 3, constrained(SamplingParams(), [7, 8])).grammar_after == (7, 8)
    assert resolve_params(mc, 3, constrained(SamplingParams(), None)).grammar_after == ()


async def test_1p1d_equals_single(checkpoints, ouro):
    """The prefill worker samples the first token unmasked (the reasoning has not ended); the decode
    worker's matcher replays it and starts at the marker: 1p1d equals single token for token."""
    mc, _, free, reqs = ouro
    work = [(p, sp) for p, sp, _ in reqs.values()]
    single = await run_all(checkpoints["ouro"], "single", "last_exited", "ouro", work)
    got = {r: list(zip(t, d, [None] * (len(t) - 1) + [f])) for r, (t, d, _, f) in zip(reqs, single)}
    pd = await run_all(checkpoints["ouro"], "1p1d", "last_exited", "ouro", work)
    assert [(t, d, f) for t, d, _, f in pd] == [(t, d, f) for t, d, _, f in single]
    check(load_tokenizer(mc.path), free, reqs, got)


def test_served_content_after_the_reasoning_obeys_the_grammar(checkpoints, served):
    """The tiny Nanbeige's template opens <think>; a bias on </think> makes the model close it at a
    seeded place. reasoning_content is the text before </think> (the grammar's tokens are not in it);
    the content after it is the schema's JSON, whole, streamed and with include_reasoning false; a
    forced tool call (required, named) gives arguments that validate, finish_reason tool_calls."""
    tok = load_tokenizer(checkpoints["nanbeige"])
    end = tok.convert_tokens_to_ids("</think>")
    tools = [{"type": "function", "function": {"name": "pick", "parameters": SCHEMA}}]
    rf = {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA}}
    extra = {"return_token_ids": True, "logit_bias": {str(end): 4.0}}
    # (conftest.served: the session's)
    client = openai.OpenAI(base_url=served("nanbeige"), api_key="none")
    kw = dict(
        model="m", messages=[{"role": "user", "content": "Why?"}], max_tokens=80, temperature=1.0
    )
    closed = 0
    for seed in range(4):
        c = client.chat.completions.create(
            **kw, seed=seed, response_format=rf, extra_body=extra
        ).choices[0]
        ids, m = c.model_extra["token_ids"], c.message
        if end not in ids:  # (the reasoning ran to max_tokens: no content)
            assert (c.finish_reason, m.content) == ("length", "")
            continue
        closed += 1
        k = ids.index(end)
        assert m.model_extra["reasoning_content"] == (
            tok.decode(ids[:k], skip_special_tokens=True) or None
        )
        assert (
            m.content == tok.decode(ids[k + 1 :], skip_special_tokens=True)
            and c.finish_reason == "stop"
        )
        jsonschema.validate(json.loads(m.content), SCHEMA)
        stream = client.chat.completions.create(
            **kw, seed=seed, response_format=rf, stream=True, extra_body=extra
        )
        deltas = [ch.choices[0].delta for ch in stream if ch.choices]
        assert "".join(d.content or "" for d in deltas) == m.content
        assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == (
            m.model_extra["reasoning_content"] or ""
        )
        dropped = client.chat.completions.create(
            **kw, seed=seed, response_format=rf, extra_body=extra | {"include_reasoning": False}
        ).choices[0]
        assert dropped.message.content == m.content and "reasoning_content" not in (
            dropped.message.model_extra or {}
        )
        for choice in ("required", {"type": "function", "function": {"name": "pick"}}):
            c = client.chat.completions.create(
                **kw,
                seed=seed,
                tools=tools,
                tool_choice=choice,
                parallel_tool_calls=False,
                extra_body=extra,
            ).choices[0]
            if end in c.model_extra["token_ids"]:
                [call] = c.message.tool_calls
                assert call.function.name == "pick" and c.finish_reason == "tool_calls"
                jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    assert closed >= 2  # (the case this checks happened)
