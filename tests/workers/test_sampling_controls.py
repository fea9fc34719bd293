"""Logit edits, penalties and min_p in the engine: against a dense reference of the model, the same
tokens on every path (regular, steady decode, chunked, preempted, prefix-cache hits, prefill/decode
workers), and their exact effects through rlt.Engine."""

import msgspec
import pytest
import torch

import rlt
from rlt import SamplingParams
from tests.kernels.helpers import reference_logits
from tests.reference import Ref
from tests.workers.helpers import PROMPTS, make, run, run_all, spy_preemptions

EVERY = dict(
    repetition_penalty=1.4,
    presence_penalty=0.6,
    frequency_penalty=0.4,
    min_p=0.05,
    logit_bias={7: 1.5, 300: -2.0, 41: 0.75},
    min_tokens=4,
)
FIXED = {"ouro": {}, "nanbeige": {}, "huginn": {"mean_recurrence": 5, "state_init": "zero"}}


def reference_greedy(ref: Ref, prompt, n, sp: SamplingParams, eos) -> list[int]:
    """Greedy over the dense reference's float32 logits at full depth, each step edited as the
    sampler documents (tests/kernels/helpers.py's reference_logits): stops at EOS or a stop id."""
    out = []
    while len(out) < n:
        states, _ = ref.run(prompt + out, [ref.depth] * (len(prompt) + len(out)))
        raw = ref.logits(states[ref.depth])[-1].float()
        banned = list(sp.stop_token_ids) + ([] if sp.ignore_eos else list(eos))
        r = dict(
            prompt=prompt,
            output=out,
            index=len(out),
            banned=banned,
            min_tokens=sp.min_tokens,
            bias=sp.logit_bias,
        )
        r |= dict(rep=sp.repetition_penalty, freq=sp.frequency_penalty, pres=sp.presence_penalty)
        out.append(int(reference_logits(raw, r).argmax()))
        if out[-1] in banned:
            break
    return out


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_penalized_greedy_equals_the_dense_reference(checkpoints, family):
    """Greedy with logit_bias, min_tokens (EOS and a stop id held back) and the three penalties
    chooses, at every step, the argmax of the reference model's logits edited by hand (float64
    weights: the logits agree to float32 rounding); the edits really change the output."""
    mc, new_engine = make(checkpoints[family], family, overrides=FIXED[family], dtype=torch.float64)
    prompt = PROMPTS[0] + [7, 7, 9]
    plain = SamplingParams(
        max_tokens=14,
        temperature=0,
        ignore_eos=True,
        exit_threshold=1.0 if family == "ouro" else None,
    )
    free = [o[0] for o in run(new_engine(), mc, {"a": (prompt, plain)})["a"]]
    sp = msgspec.structs.replace(plain, ignore_eos=False, stop_token_ids=[free[1]], **EVERY)
    got = run(new_engine(), mc, {"a": (prompt, sp)})["a"]
    want = reference_greedy(
        Ref(checkpoints[family], FIXED[family]), prompt, 14, sp, mc.eos_token_ids
    )
    assert [o[0] for o in got] == want
    assert want != free[: len(want)] and free[1] not in want[:4]
    assert got[-1][3] == ("stop" if len(want) < 14 else "length")


def workload(family) -> dict:
    """Greedy and seeded requests, every control on (min_p, logit_bias, min_tokens, penalties), one
    of them without any, adaptive exits where the family has a gate."""
    gate = family == "ouro"
    exits = dict(exit_threshold=0.5) if gate else {}
    params = [
        SamplingParams(max_tokens=12, temperature=0, logprobs=2, **EVERY, **exits),
        # stops at 4
        SamplingParams(max_tokens=10, temperature=1.0, seed=3, stop_token_ids=[328, 371], **EVERY),
        SamplingParams(
            max_tokens=11, temperature=0.8, top_k=20, top_p=0.9, seed=5, **EVERY, **exits
        ),
        SamplingParams(max_tokens=9, temperature=0.7, seed=6, ignore_eos=True, **exits),
        SamplingParams(
            max_tokens=13, temperature=1.2, seed=8, repetition_penalty=0.8, frequency_penalty=-0.5
        ),
    ]
    prompts = PROMPTS + [
        [9, 8, 7, 6, 5, 4, 3, 2, 1],
        [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 40],
    ]
    return {str(i): (prompts[i], params[i]) for i in range(5)}


@pytest.mark.parametrize("family", ["ouro", "huginn"])
def test_every_path_samples_the_same_tokens(checkpoints, family):
    """The regular path, steady decode, other prefill chunkings, preemption with resumption by
    recompute (penalty state rebuilt from the host's tokens), and prefix-cache hits (the prompt's
    penalties still cover the whole prompt) give the same tokens, depths and finish reasons."""
    mc, new_engine = make(checkpoints[family], family)
    reqs = workload(family)

    def same(got):
        return {r: [(o[0], o[1], o[3]) for o in v] for r, v in got.items()}

    base = same(run(new_engine(steady_decode="never"), mc, reqs))
    assert len({len(v) for v in base.values()}) > 1 and any(
        v[-1][2] == "stop" for v in base.values()
    )
    for cfg in (dict(steady_decode="always"), dict(prefill_chunk=2), dict(prefill_chunk=64)):
        engine = new_engine(**cfg)
        assert same(run(engine, mc, reqs, arrivals={"2": 3, "4": 9})) == base, cfg
        if family == "ouro" and "steady_decode" in cfg:
            assert engine.steady_steps > 10
    small = new_engine(num_blocks=1)
    engine = new_engine(num_blocks=(small.pool.num_core_planes + int(small.pool.has_boundary)) * 9)
    seen = spy_preemptions(engine)
    assert same(run(engine, mc, reqs, arrivals={"0": 0, "1": 0, "2": 2, "3": 5, "4": 6})) == base
    assert engine.preemptions >= 2 and max(seen) >= 3  # penalized requests resumed mid-decode
    engine = new_engine()
    run(engine, mc, reqs)  # their prompts' blocks now cached
    hits = engine.pool.prefix.hit_tokens
    assert same(run(engine, mc, {r + "'": v for r, v in reqs.items()})) == {
        r + "'": v for r, v in base.items()
    }
    assert engine.pool.prefix.hit_tokens > hits + 8


@pytest.mark.parametrize("family", ["ouro", "huginn"])
def test_a_huge_repetition_penalty_never_repeats_a_token(checkpoints, family):
    """Repetition penalty 1e6 leaves every prompt and output token below the others: greedy never
    takes a token of the prompt (its first tokens are the unpenalized run's output, the prompt
    spans chunks), nor one it already took; likewise on a prefix-cache hit and in steady decode."""
    mc, new_engine = make(checkpoints[family], family)
    plain = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    free = [o[0] for o in run(new_engine(), mc, {"a": ([3, 4], plain)})["a"]]
    # ~45% of the vocabulary
    prompt = free + [(7 * i + 5) % mc.vocab_size for i in range(200)] + [3, 4]
    sp = msgspec.structs.replace(
        plain, repetition_penalty=1e6, exit_threshold=0.5 if family == "ouro" else None
    )
    engine = new_engine(steady_decode="always")
    for rid in ("a", "b"):  # b: its prompt's blocks cached by a
        out = [o[0] for o in run(engine, mc, {rid: (prompt, sp)})[rid]]
        assert not set(out) & set(prompt) and len(set(out)) == len(out), out
    assert engine.pool.prefix.hit_tokens >= 200


def test_edits_cost_nothing_when_unused(checkpoints, monkeypatch):
    """A pass whose sampled rows use no edit never reaches the edit path."""
    from rlt.workers import sampling

    mc, new_engine = make(checkpoints["ouro"], "ouro")
    calls = []
    monkeypatch.setattr(sampling, "edit", lambda *a, **k: calls.append(1))
    plain = SamplingParams(max_tokens=5, temperature=0.5, seed=1, top_k=3, ignore_eos=True)
    run(
        new_engine(steady_decode="always"), mc, {"a": (PROMPTS[0], plain), "b": (PROMPTS[1], plain)}
    )
    assert calls == []


async def test_bias_and_min_tokens_through_the_engine(checkpoints):
    """Greedy with logit_bias +100 on a token takes it every step; min_tokens = k with EOS made the
    argmax gives exactly k tokens, then EOS (finish "stop"); a stop id made the argmax likewise."""
    async with rlt.Engine.launch(
        checkpoints["ouro"], heartbeat_interval=0.2, startup_timeout=60.0
    ) as engine:
        (eos,) = engine.model_config.eos_token_ids

        async def final(sp):
            outs = [o async for o in engine.generate([5, 6, 7, 8, 9], sp)]
            return outs[-1]

        out = await final(
            SamplingParams(max_tokens=9, temperature=0, logit_bias={123: 100.0}, ignore_eos=True)
        )
        assert out.token_ids == [123] * 9 and out.finish_reason == "length"
        for k in (0, 1, 5):
            out = await final(
                SamplingParams(
                    max_tokens=12, temperature=0.7, seed=k, logit_bias={eos: 100.0}, min_tokens=k
                )
            )
            assert len(out.token_ids) == k + 1 and eos not in out.token_ids[:k], (k, out.token_ids)
            assert out.token_ids[-1] == eos and out.finish_reason == "stop"
        sp = SamplingParams(
            max_tokens=12, temperature=0, logit_bias={44: 100.0}, stop_token_ids=[44], min_tokens=3
        )
        out = await final(sp)
        assert len(out.token_ids) == 4 and out.token_ids[-1] == 44 and out.finish_reason == "stop"


async def test_pd_equals_single_with_every_control(checkpoints):
    """The prefill worker samples the first token with the same edits as a unified worker (its
    prompt penalties, min_tokens' ban, the bias), the decode worker continues from a slot loaded
    with that token, and a decode worker that preempts and resumes rebuilds it: 1p1d equals single
    token for token, greedy and seeded."""
    reqs = list(workload("ouro").values())
    single = await run_all(checkpoints["ouro"], "single", "last_exited", "ouro", reqs)
    stats = []
    for opts in (dict(), dict(num_blocks=4 * 9)):
        got = await run_all(checkpoints["ouro"], "1p1d", "last_exited", "ouro", reqs, stats, **opts)
        assert [(t, d, f) for t, d, _, f in got] == [(t, d, f) for t, d, _, f in single], opts
    decode = next(w for w in stats[-1].workers if w.role == "decode")
    assert decode.preemptions > 0
    assert any(f == "stop" for *_, f in single) and len({len(t) for t, *_ in single}) > 1
