"""Huginn's exit criteria as request options (issue 33, items 1 and 2), exact against the authors'
`generate_with_adaptive_compute` (tests/workers/huginn_reference.json, made by
dev/huginn_reference.py: batch 1, greedy, zero initial state, latest-m4, the prompt at full depth):
every criterion's tokens and per-token recurrence counts, alone and all at once (rows of six
criteria and several depths in one pass), under preemption, with prefix caching, and through 1p1d
and 2x. A held-out check of the same kind (tests/workers/huginn_reference_heldout.json: another
seed's checkpoint, depth 10, other prompts and thresholds, none used while the criteria were
built)."""

import asyncio

import pytest

import rlt
from rlt import RequestError
from rlt.contract.sampling_params import EXIT_CRITERIA, SamplingParams
from rlt.contract.validation import resolve_params
from rlt.models.model_config import ModelConfig
from rlt.serve.requests import CompletionRequest, to_sampling_params
from rlt.workers.exit_criteria import LATENT
from tests.helpers import FAST_PD, SMALL
from tests.workers.helpers import make, run
from tests.workers.huginn_cases import CASES, FIXED, FIXTURE, HELDOUT, VARIED, expect, params


def engine_for(checkpoints, **cfg):
    return make(checkpoints["huginn"], "huginn", overrides=FIXTURE["overrides"], **cfg)


def test_every_criterion_all_at_once_equals_the_authors_code(checkpoints):
    """Thirty requests, six criteria at auto and chosen thresholds, in the same passes."""
    mc, engine = engine_for(checkpoints, enable_prefix_caching=False)
    expect(run(engine(), mc, {i: (c["prompt"], params(c)) for i, c in enumerate(CASES)}), CASES)


@pytest.mark.parametrize("criterion", ["latent-diff", "cosine", "kl", "argmax-stability"])
def test_a_criterion_alone_equals_the_authors_code(checkpoints, criterion):
    mc, engine = engine_for(checkpoints, enable_prefix_caching=False)
    cases = [
        c for c in VARIED if c["criterion"] == criterion and c["prompt"] == VARIED[-1]["prompt"]
    ]
    for c in cases:
        expect(run(engine(), mc, {0: (c["prompt"], params(c))}), [c])


def counted_tails(engine) -> list[int]:
    """A spy: [passes whose exited groups ran the tail (coda, head, sampling)]."""
    n, tail = [0], engine.runner._exit

    def counted(result):
        n[0] += 1
        return tail(result)

    engine.runner._exit = counted
    return n


@pytest.mark.parametrize("wait", [3, 1000])
def test_exited_rows_wait_for_each_other_with_their_tokens_and_depths(checkpoints, wait):
    """exit_wait_passes: a row its criterion exited parks (held on the device) until the tail runs
    for another group, or it has waited `wait` passes: the tokens and depths stay the authors', in
    fewer tails; under preemption too."""
    mc, engine = engine_for(checkpoints, enable_prefix_caching=False)
    requests = {i: (c["prompt"], params(c)) for i, c in enumerate(CASES)}
    at_once, waiting = engine(exit_wait_passes=0), engine(exit_wait_passes=wait)
    tails = counted_tails(at_once), counted_tails(waiting)
    expect(run(at_once, mc, requests), CASES)
    expect(run(waiting, mc, requests), CASES)
    assert tails[1][0] < tails[0][0], tails
    cases = [c for c in VARIED if c["prompt"] == VARIED[-1]["prompt"]]
    e = engine(num_blocks=9 * 16, exit_wait_passes=wait)
    expect(run(e, mc, {i: (c["prompt"], params(c)) for i, c in enumerate(cases)}), cases)
    assert e.preemptions > 0


def test_preempted_and_resumed_rows_keep_their_exits(checkpoints):
    """A pool too small for all of them: requests are preempted and resume by recomputing each
    generated position at its exit depth; tokens and depths are the authors'."""
    mc, engine = engine_for(checkpoints, enable_prefix_caching=False, num_blocks=9 * 16)
    cases = [c for c in VARIED if c["prompt"] == VARIED[-1]["prompt"]]
    e = engine()
    expect(run(e, mc, {i: (c["prompt"], params(c)) for i, c in enumerate(cases)}), cases)
    assert e.preemptions > 0


def test_resumed_positions_run_their_coda_in_order(checkpoints):
    """Preempted requests resume onto each other's cached blocks (identical tokens and depths) and
    recompute the rest: a recomputed position whose exit depth is below an earlier one's must not
    run its coda before that one has written its coda K/V."""
    mc, engine = engine_for(checkpoints, num_blocks=96, prefill_chunk=64)
    cases = [c for c in VARIED if c["criterion"] in ("latent-diff", "cosine")] * 3
    e = engine()
    expect(run(e, mc, {i: (c["prompt"], params(c)) for i, c in enumerate(cases)}), cases)
    assert e.preemptions > 0 and e.pool.prefix.hit_tokens > 0


@pytest.mark.parametrize("wait", [0, 3, 8])
def test_steady_decode_lanes_equal_the_authors_code(checkpoints, wait):
    """Every criterion's varied cases and fixed depths all at once run as device-side lanes (steady
    decode: the checks on the device, the logit criteria's over the coda and head of every lane,
    exited lanes parked until a boundary pass, every exit_wait_passes passes) and give the
    reference's tokens and depths; every block comes back."""
    cases = VARIED + FIXED
    mc, engine = engine_for(checkpoints, enable_prefix_caching=False, exit_wait_passes=wait)
    e = engine()
    blocks = e.num_free_blocks
    expect(run(e, mc, {i: (c["prompt"], params(c)) for i, c in enumerate(cases)}), cases)
    assert e.steady_steps > 10 and e.num_free_blocks == blocks


def test_a_lone_parked_lane_does_not_wait_for_others(checkpoints):
    """One request alone in steady decode with exit_wait_passes 8: once the host reads that every lane
    is parked, the boundary pass comes at once (the regular path releases rows when only parked ones
    are left), so each token costs its loops and one boundary pass, not eight passes of waiting (on
    the CPU every read-back is ready at once)."""
    c = next(c for c in VARIED if c["criterion"] == "latent-diff")
    mc, engine = engine_for(checkpoints, enable_prefix_caching=False, exit_wait_passes=8)
    e = engine()
    expect(run(e, mc, {0: (c["prompt"], params(c))}), [c])
    decoded = c["depths"][1:]  # (the first token comes from the prompt's passes)
    assert sum(decoded) <= e.steady_steps <= sum(decoded) + len(decoded) + 1, (
        e.steady_steps,
        decoded,
    )


def test_steady_decode_lanes_at_fixed_depth_equal_the_authors_code(checkpoints):
    """Every lane at a fixed depth (steady_decode "always"): boundary passes only where lanes reach it."""
    mc, engine = engine_for(checkpoints, enable_prefix_caching=False, steady_decode="always")
    e = engine()
    expect(run(e, mc, {i: (c["prompt"], params(c)) for i, c in enumerate(FIXED)}), FIXED)
    assert e.steady_steps > 20


@pytest.mark.parametrize("init", ["zero", "like-init"])
def test_steady_decode_lanes_equal_the_regular_path_sampled(checkpoints, init):
    """Sampled lanes with logprobs and penalties, a logit and a latent criterion and fixed depth, with
    arrivals that end and restart the stretches and an abort: the same tokens, depths and finish reasons as the
    regular path, logprobs to float32 rounding (the boundary pass's coda and head run over every
    lane); a zero initial latent, or one drawn per seed and position."""
    c = [c for c in VARIED if c["criterion"] in LATENT]
    sps = [
        SamplingParams(
            max_tokens=9,
            temperature=0.8,
            seed=4,
            exit_criterion="kl",
            exit_threshold=0.3,
            logprobs=2,
        ),
        SamplingParams(
            max_tokens=7,
            temperature=1.0,
            seed=5,
            top_k=20,
            exit_criterion="cosine",
            exit_threshold=0.09,
            min_loops=2,
            repetition_penalty=1.3,
        ),
        SamplingParams(max_tokens=8, temperature=0, min_loops=3, max_loops=3, logprobs=1),
    ]
    requests = {str(i): (c[i % len(c)]["prompt"], sps[i % 3]) for i in range(6)}
    arrivals = {"0": 0, "1": 0, "2": 0, "3": 5, "4": 14, "5": 15}
    runs = {}
    for steady in ("never", "adaptive"):
        # like-init: each new token's latent drawn by its seed
        ov = FIXTURE["overrides"] | {"state_init": init}
        mc, engine = make(checkpoints["huginn"], "huginn", overrides=ov, steady_decode=steady)
        e = engine()
        runs[steady] = run(e, mc, requests, arrivals, abort_at=("1", 12))
        assert (e.steady_steps > 10) == (steady == "adaptive")
    for rid, outs in runs["never"].items():
        assert [(o[0], o[1], o[3]) for o in runs["adaptive"][rid]] == [
            (o[0], o[1], o[3]) for o in outs
        ]
        for (_, _, a, _), (_, _, b, _) in zip(runs["adaptive"][rid], outs):
            assert (a or {}).keys() == (b or {}).keys() and all(
                abs(a[t] - b[t]) < 1e-5 for t in a or ()
            )
    assert len(set(d for outs in runs["never"].values() for _, d, _, _ in outs)) >= 3  # depths vary


def test_prefix_cache_serves_a_repeated_prompt_with_the_same_exits(checkpoints):
    mc, engine = engine_for(checkpoints)
    e, c = engine(), next(c for c in VARIED if c["criterion"] == "kl")
    sp = resolve_params(mc, len(c["prompt"]), params(c))
    for hit in (0, len(c["prompt"]) // 4 * 4):
        e.add_request("r", c["prompt"], sp)
        outs = []
        while e.has_work():
            outs += e.step()
        assert outs[0].num_cached_tokens == hit
        assert ([o.token_id for o in outs], [o.exit_depth for o in outs]) == (
            c["tokens"],
            c["depths"],
        )


@pytest.mark.parametrize("topology", ["1p1d", "2x"])
async def test_every_case_through_pd_and_replicas_equals_the_authors_code(checkpoints, topology):
    """Every fixture case whose exits vary, and fixed depths, all at once. 1p1d: the prefill worker
    runs the prompt at max_loops and samples the first token, the decode worker checks each
    criterion per row. 2x: two replicas behind the coordinator (routed by cached prefix and load),
    each running its share of the rows in its own passes."""
    cases = VARIED + [c for c in FIXTURE["cases"] if c["criterion"] == "none"]
    async with rlt.Engine.launch(
        checkpoints["huginn"],
        topology=topology,
        hf_overrides=FIXTURE["overrides"],
        **(SMALL | FAST_PD),
    ) as engine:
        workers = set()

        async def one(i, c):
            async for out in engine.generate(c["prompt"], params(c), request_id=f"c{i}"):
                if (r := engine._lifecycle.live.get(f"c{i}")) is not None:
                    workers.add(r.decode.worker.pid)
            return out

        outs = await asyncio.gather(*(one(i, c) for i, c in enumerate(cases)))
    assert len(workers) == (2 if topology == "2x" else 1)
    for o, c in zip(outs, cases):
        assert (o.token_ids, o.exit_depths) == (c["tokens"], c["depths"]), c


def test_held_out_cases_equal_the_authors_code(tmp_path_factory):
    """Every held-out case at once: made by the same script after rlt's criteria were built, on a
    checkpoint of another seed at depth 10, with prompts and thresholds none of the tests above use,
    chosen so that no checked value comes within 0.1 % of its threshold and no argmax within 1e-3 of
    the runner-up (float32 noise flips neither an exit nor a token). Prefix caching on: the cases of
    one prompt share its cached blocks."""
    from rlt.models.checkpoint import make_checkpoint

    ck, n = HELDOUT["checkpoint"], HELDOUT["max_new_tokens"]
    assert ck["seed"] != FIXTURE["checkpoint"]["seed"]
    path = make_checkpoint(
        "huginn", str(tmp_path_factory.mktemp("heldout")), preset=ck["preset"], seed=ck["seed"]
    )
    cases = HELDOUT["cases"]
    assert {c["criterion"] for c in cases} == set(EXIT_CRITERIA) | {"none"}
    assert (
        all(c.get("margin") is None or c["margin"] > 1e-3 for c in cases)
        and min(c["gap"] for c in cases) > 1e-3
    )
    mc, engine = make(path, "huginn", overrides=HELDOUT["overrides"])
    expect(run(engine(), mc, {i: (c["prompt"], params(c, n)) for i, c in enumerate(cases)}), cases)


def test_thresholds_are_read_per_criterion(checkpoints):
    mc = ModelConfig.from_pretrained(checkpoints["huginn"])
    for crit, auto in EXIT_CRITERIA.items():
        p = resolve_params(mc, 3, SamplingParams(exit_criterion=crit))
        assert (p.exit_criterion, p.exit_threshold) == (crit, auto)
    assert (
        resolve_params(
            mc, 3, SamplingParams(exit_criterion="latent-diff", exit_threshold=1.5)
        ).exit_threshold
        == 1.5
    )
    assert (
        resolve_params(
            mc, 3, SamplingParams(exit_criterion="argmax-stability", exit_threshold=7)
        ).exit_threshold
        == 7
    )
    # (fixed depth without a gate)
    assert resolve_params(mc, 3, SamplingParams()).exit_criterion == "gate"
    refused = [
        (
            dict(exit_criterion="argmax-stability", exit_threshold=2.5),
            "argmax-stability counts checks",
        ),
        (
            dict(exit_criterion="argmax-stability", exit_threshold=0),
            "argmax-stability counts checks",
        ),
        (dict(exit_criterion="kl", exit_threshold=0), "exit_threshold of kl must be > 0"),
        (
            dict(exit_criterion="cosine", exit_threshold=-1.0),
            "exit_threshold of cosine must be > 0",
        ),
        (dict(exit_criterion="halting"), "exit_criterion must be one of gate, latent-diff"),
        (dict(exit_threshold=1.5), r"exit_threshold must be in \[0, 1\]"),
    ]
    for kw, msg in refused:
        with pytest.raises(RequestError, match=msg):
            resolve_params(mc, 3, SamplingParams(**kw))
    for family in ("ouro", "nanbeige"):  # Ouro exits by its gate; Nanbeige runs fixed depth
        with pytest.raises(RequestError, match=r"exit_criterion 'kl' is for Huginn models"):
            resolve_params(
                ModelConfig.from_pretrained(checkpoints[family]),
                3,
                SamplingParams(exit_criterion="kl"),
            )


def test_http_body_carries_the_criterion():
    req = CompletionRequest(prompt="hi", exit_criterion="minp-kl", exit_threshold=0.2, min_loops=3)
    sp, _ = to_sampling_params(req, False, {})
    assert (sp.exit_criterion, sp.exit_threshold, sp.min_loops) == ("minp-kl", 0.2, 3)
