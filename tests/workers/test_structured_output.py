"""Grammar-constrained decoding (rlt/contract/grammar.py, rlt/workers/grammar.py): with random
weights only the grammar can make the output valid. Every family's seeded JSON-schema samples
validate, regex and choice outputs match; the same tokens on every path (steady decode allowed for
the others, chunked, preempted, prefix-cache hits) and in 1p1d as in single; bad specs are refused
at the call, by name; the sampler's mask against a dense reference."""

import json

import msgspec
import pytest
import torch

import rlt
from rlt import SamplingParams, StructuredOutput
from rlt.errors import RequestError
from rlt.kernels.sampler import LogitEdits, allowed_mask, edit
from rlt.models.tokenizer import load_tokenizer
from tests.workers.grammar_cases import CHOICES, SCHEMA, check_valid, workload
from tests.workers.helpers import make, run, run_all, spy_preemptions


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_outputs_obey_their_grammars_on_every_path(checkpoints, family):
    """Valid outputs through each family's tokenizer; an unconstrained request beside them samples
    what it samples alone (with steady decode on). Then, for Ouro, the same tokens, depths and
    finish reasons with steady decode on (the others may use it; constrained ones stay on the
    regular path), other chunkings, preemption (resumed mid-decode: the matcher keeps its accepted
    outputs) and prefix-cache hits. (Those paths are the scheduler's and the matcher's, alike for
    every family: each family's own chunking, preemption and prefix cache are checked without a
    grammar in test_engine, test_preemption and test_prefix_cache; Ouro's adaptive exit is the one
    that reads a token back before its last loop.)"""
    # (Huginn at 2 loops, not test_engine's 6: its recurrence is not what a grammar constrains)
    mc, new_engine = make(
        checkpoints[family],
        family,
        overrides={"mean_recurrence": 2} if family == "huginn" else None,
    )
    tok = load_tokenizer(mc.path)
    reqs = workload(tok)

    def same(got):
        return {r: [(o[0], o[1], o[3]) for o in v] for r, v in got.items()}

    base = run(new_engine(steady_decode="never"), mc, reqs)
    check_valid(tok, base)
    base = same(base)
    assert same(run(new_engine(), mc, {"free": reqs["free"]}))["free"] == base["free"]
    if family != "ouro":
        return
    for cfg in (dict(steady_decode="always"), dict(prefill_chunk=2), dict(prefill_chunk=64)):
        assert same(run(new_engine(**cfg), mc, reqs, arrivals={"r": 3, "o": 9})) == base, cfg
    small = new_engine(num_blocks=1)
    engine = new_engine(num_blocks=(small.pool.num_core_planes + int(small.pool.has_boundary)) * 33)
    seen = spy_preemptions(engine)
    assert same(run(engine, mc, reqs, arrivals={"c": 2, "o": 5, "free": 6})) == base
    assert engine.preemptions >= 1 and max(seen) >= 3  # resumed mid-decode
    engine = new_engine()
    run(engine, mc, reqs)
    hits = engine.pool.prefix.hit_tokens
    assert same(run(engine, mc, {r + "'": v for r, v in reqs.items()})) == {
        r + "'": v for r, v in base.items()
    }
    assert engine.pool.prefix.hit_tokens > hits


def test_unconstrained_rows_never_reach_the_mask(checkpoints, monkeypatch):
    """A pass without a constrained row builds no mask (and a run without any takes steady decode)."""
    from rlt.workers import grammar

    mc, new_engine = make(checkpoints["ouro"], "ouro")
    calls = []
    monkeypatch.setattr(grammar.Constraint, "fill", lambda self: calls.append(1))
    engine = new_engine(steady_decode="always")
    run(engine, mc, {"free": workload(load_tokenizer(mc.path))["free"]})
    assert calls == [] and engine.steady_steps > 0


def test_mask_against_a_dense_reference():
    """allowed_mask unpacks bit t % 32 of word t // 32; edit puts -inf exactly on disallowed tokens of
    the constrained rows, after the other edits, and leaves other rows alone."""
    g = torch.Generator().manual_seed(0)
    B, V = 5, 77
    dense = torch.rand(3, V, generator=g) < 0.3
    words = torch.zeros(3, -(-V // 32), dtype=torch.int64)
    for r in range(3):
        for t in range(V):
            if dense[r, t]:
                words[r, t // 32] |= 1 << (t % 32)
    # as int32 words (xgrammar's), widened
    words = torch.where(words >= 2**31, words - 2**32, words)
    assert torch.equal(allowed_mask(words, V), dense)
    logits = torch.randn(B, V, generator=g)
    rows = torch.tensor([0, 2, 4])
    e = LogitEdits(
        bias=(torch.tensor([2]), torch.tensor([5]), torch.tensor([100.0])), allowed=(rows, words)
    )
    got = edit(logits, e, torch.zeros(B, dtype=torch.int64))
    want = logits.clone()
    want[2, 5] += 100.0
    for i, r in enumerate(rows.tolist()):
        want[r][~dense[i]] = float("-inf")
    assert torch.equal(got, want)


def test_ids_past_the_tokenizer_are_never_allowed(checkpoints):
    """A model vocabulary wider than the tokenizer's: the extra ids are never in a mask."""
    import xgrammar as xgr

    from rlt.contract.grammar import spec_of
    from rlt.workers.grammar import Constraint
    from rlt.workers.grammar_zygote import compile_spec, tokenizer_info

    mc, _ = make(checkpoints["ouro"], "ouro")
    tok = load_tokenizer(mc.path)
    V = len(tok) + 70
    compiler = xgr.GrammarCompiler(tokenizer_info(tok, V, mc.eos_token_ids))
    for so in (
        StructuredOutput(json_object=True),
        StructuredOutput(regex=".*"),
        StructuredOutput(grammar='root ::= [^"]*'),
    ):
        c = Constraint(compile_spec(compiler, spec_of(so)), [])
        allowed = allowed_mask(torch.from_numpy(c.fill().astype("int64"))[None], V)[0]
        assert allowed[: len(tok)].any() and not allowed[len(tok) :].any(), so


async def test_through_the_engine_single_equals_1p1d(checkpoints):
    """Real workers: valid outputs; the prefill worker's first token is constrained and the decode
    worker's matcher starts after it, so 1p1d equals single token for token (also when the decode
    worker preempts: its pool is small enough that some requests are preempted and resumed, while
    the others run as with a large pool)."""
    tok = load_tokenizer(checkpoints["ouro"])
    names, reqs = zip(*workload(tok).items())
    single = await run_all(checkpoints["ouro"], "single", "last_exited", "ouro", list(reqs))
    check_valid(
        tok, {r: [(t, 0, None, f) for t in toks] for r, (toks, _, _, f) in zip(names, single)}
    )
    stats = []
    got = await run_all(
        checkpoints["ouro"], "1p1d", "last_exited", "ouro", list(reqs), stats, num_blocks=4 * 33
    )
    assert [(t, d, f) for t, d, _, f in got] == [(t, d, f) for t, d, _, f in single]
    assert next(w for w in stats[-1].workers if w.role == "decode").preemptions > 0


async def test_bad_specs_are_refused_at_the_call(checkpoints):
    """A bad schema, regex, grammar or choice, or not exactly one field, is a RequestError naming the
    field, raised by generate() itself; the engine serves on."""
    bad = {
        "structured_output.json: ": StructuredOutput(json={"type": "foo"}),
        "structured_output.json: not JSON": StructuredOutput(json="{nope"),
        "structured_output.regex: ": StructuredOutput(regex="(ab"),
        "structured_output.grammar: ": StructuredOutput(grammar="root ::= undefined_rule"),
        "structured_output.choice must": StructuredOutput(choice=[]),
        "structured_output must set exactly one": StructuredOutput(regex="a", choice=["a"]),
    }
    async with rlt.Engine.launch(
        checkpoints["ouro"], heartbeat_interval=0.2, startup_timeout=60.0
    ) as engine:
        for start, so in bad.items():
            with pytest.raises(RequestError) as e:
                engine.generate([5, 6], SamplingParams(max_tokens=4, structured_output=so))
            assert str(e.value).startswith(start), str(e.value)
        sp = SamplingParams(
            max_tokens=20,
            temperature=1.0,
            seed=1,
            structured_output=StructuredOutput(choice=CHOICES),
        )
        outs = [o async for o in engine.generate([5, 6], sp)]
        assert outs[-1].text in CHOICES and outs[-1].finish_reason == "stop"
        sp = msgspec.structs.replace(sp, structured_output=None, max_tokens=3)
        assert len([o async for o in engine.generate([5, 6], sp)][-1].token_ids) <= 3


def test_spec_shapes():
    """A schema as a dict or as its JSON text is one spec (one cache entry); unknown keys and a
    json_object of false are refused."""
    from rlt.contract.grammar import spec_of

    assert spec_of(StructuredOutput(json=SCHEMA)) == spec_of(
        StructuredOutput(json=json.dumps(SCHEMA))
    )
    assert spec_of(StructuredOutput(choice=["a", 'b"'])) == ("choice", '["a", "b\\""]')
    assert spec_of(None) is None
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.convert({"regexp": "a"}, StructuredOutput)
    with pytest.raises(RequestError, match="exactly one"):
        spec_of(StructuredOutput(json_object=False))


def test_a_grammar_that_fails_to_compile_fails_its_request_alone(checkpoints):
    """The coordinator checks a grammar's structure only; a compile that still fails in the worker
    (one that can match nothing; one past grammar_compile_timeout, its process killed) is reported
    for that request, naming the field, and holds nobody up (the worker then fails it, as here)."""
    from rlt.contract.validation import resolve_params

    mc, new_engine = make(checkpoints["ouro"], "ouro")
    engine = new_engine(grammar_compile_timeout=1.0, max_grammar_entries=100_000)
    free = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    nothing = msgspec.structs.replace(free, structured_output=StructuredOutput(regex="[^\\s\\S]"))
    many = StructuredOutput(choice=[f"w{i} " * 4 for i in range(20_000)])
    slow = msgspec.structs.replace(free, structured_output=many)
    engine.add_request(1, [5, 6], resolve_params(mc, 2, nothing))
    engine.add_request(3, [5, 6], resolve_params(mc, 2, slow))
    engine.add_request(2, [5, 6], resolve_params(mc, 2, free))
    outs, failed = [], []
    while engine.has_work():
        outs += [o.request_id for o in engine.step()]
        for gen, error in engine.grammars.take_failed():
            failed.append((gen, error))
            assert engine.abort(gen)
        engine.grammars.wait(0.01)
    assert outs == [2, 2, 2] and sorted(failed) == [
        (1, "structured_output.regex: no output can match it"),
        (3, "structured_output.choice: did not compile within 1 s (grammar_compile_timeout)"),
    ]


def test_json_strings_admit_no_control_characters():
    """Every JSON grammar refuses a raw U+0000-U+001F inside a string (xgrammar 0.2.9's bounded
    strings admitted them; a free string still takes the escaped form); tool calls' tags too."""
    from xgrammar.testing import _is_grammar_accept_string as accepts

    from rlt.contract.grammar import grammar_of, spec_of
    from rlt.serve.structured import tool_call_tag

    bounded = {"type": "string", "maxLength": 4}
    for schema in (
        bounded,
        {"type": "string", "minLength": 1},
        {"type": "string"},
        {"type": "array", "items": bounded},
    ):
        g = grammar_of(spec_of(StructuredOutput(json=schema)))
        wrap = (lambda s: f"[{s}]") if schema.get("type") == "array" else (lambda s: s)
        for c in ("\x00", "\x01", "\t", "\x1f"):
            assert not accepts(g, wrap(f'"a{c}"')), (schema, c)
        assert accepts(g, wrap('"ab"')), schema
        # (length-bounded: no escapes)
        assert accepts(g, wrap('"a\\tb"')) == (schema == {"type": "string"}), schema
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"a": bounded}},
            },
        }
    ]
    g = grammar_of(spec_of(tool_call_tag(tools, one=False)))
    call = '<tool_call>\n{"name": "f", "arguments": {"a": "%s"}}\n</tool_call>'
    assert accepts(g, "text " + call % "xy") and not accepts(g, "text " + call % "x\x01")


def test_json_strings_are_utf8(checkpoints):
    """A UTF-16 surrogate's 3-byte form (not UTF-8) is no JSON string character; other codepoints are."""
    import xgrammar as xgr

    from rlt.contract.grammar import grammar_of, spec_of
    from rlt.workers.grammar_zygote import tokenizer_info

    tok = load_tokenizer(checkpoints["ouro"])
    compiler = xgr.GrammarCompiler(tokenizer_info(tok, len(tok), [len(tok) - 1]))
    for schema in ({"type": "string"}, {"type": "string", "maxLength": 4}):
        compiled = compiler.compile_grammar(grammar_of(spec_of(StructuredOutput(json=schema))))
        for text, ok in ((b'"\xed\xa0\x80"', False), ('"\u00fc\u20ac"'.encode(), True)):
            assert xgr.GrammarMatcher(compiled).accept_string(text) == ok, (schema, text)
