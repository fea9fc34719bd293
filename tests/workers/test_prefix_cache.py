"""Depth-aware prefix caching: a request admitted onto cached blocks streams exactly what it streams
with the cache off (tokens, exit depths, finish reasons; logprobs to float32 rounding), and reuses
exactly the blocks whose every position matches in token and depth (prompt positions run at full
depth, generated ones at their exit depth), under the state seed that Huginn's KV depends on."""

import asyncio

import msgspec
import pytest
import torch

import rlt
from rlt.contract.sampling_params import SamplingParams
from rlt.contract.validation import resolve_params
from rlt.workers.prefix_cache import PrefixCache
from tests.helpers import FAST_PD, OV, SMALL, all_free
from tests.workers.helpers import make, mixed_params
from tests.workers.helpers import requests as pd_requests

BS = 4  # test_engine.make's block size
FIRST = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
OTHER = [100, 200, 300, 400, 500, 6, 7, 8, 9, 10, 11]


def drive(engine, mc, requests: dict) -> dict:
    """Run requests {id: (prompt, SamplingParams)} together to the end. -> {id: (outputs, cached)}:
    outputs [(token, depth, logprobs, finish)], cached: the first output's num_cached_tokens."""
    for rid, (prompt, sp) in requests.items():
        engine.add_request(rid, prompt, resolve_params(mc, len(prompt), sp))
    outs, cached = {rid: [] for rid in requests}, {}
    for _ in range(2000):
        if not engine.has_work():
            return {rid: (outs[rid], cached.get(rid)) for rid in requests}
        for o in engine.step():
            outs[o.request_id].append((o.token_id, o.exit_depth, o.logprobs, o.finish_reason))
            if o.num_cached_tokens is not None:  # (the first output's)
                cached[o.request_id] = o.num_cached_tokens
    raise AssertionError("did not finish")


def known(prompt, outs, depth) -> list[tuple[int, int]]:
    """(token, depth) of every position a finished request knows: its prompt at full depth, each
    generated position at the depth of the token sampled from it."""
    return [(t, depth) for t in prompt] + [
        (outs[i][0], outs[i + 1][1]) for i in range(len(outs) - 1)
    ]


def expected_hit(cached: list[tuple[int, int]], prompt, depth) -> int:
    """Positions of `prompt` (all at full depth) a cache holding `cached` serves: whole matching
    blocks, never the last prompt position."""
    want = [(t, depth) for t in prompt]
    n = 0
    while (n + BS) <= min(len(cached), len(prompt) - 1) and cached[n : n + BS] == want[n : n + BS]:
        n += BS
    return n


def assert_same(got: dict, ref: dict, family) -> None:
    tol = 1e-3 if family == "huginn" else 1e-4
    for rid, (outs, _) in ref.items():
        assert [(o[0], o[1], o[3]) for o in got[rid][0]] == [(o[0], o[1], o[3]) for o in outs], rid
        for a, b in zip(got[rid][0], outs):
            assert (a[2] or {}).keys() == (b[2] or {}).keys() and all(
                abs(a[2][t] - b[2][t]) <= tol for t in a[2] or ()
            )


def turns(family, fixed: bool):
    """A first turn of three requests (greedy, seeded, adaptive exit unless `fixed`), then second
    turns: each first prompt + its output + new tokens (the first with another exit threshold), and
    a request sharing the first prompt's first 12 tokens under another seed."""
    params = [msgspec.structs.replace(p, max_tokens=10) for p in mixed_params(family)]
    if fixed:
        params = [msgspec.structs.replace(p, exit_threshold=1.0, min_loops=None) for p in params]
    first = {"a": (FIRST, params[0]), "b": (OTHER, params[1]), "c": (FIRST[3:], params[2])}

    def second(out):
        later = {
            rid: (prompt + [o[0] for o in out[rid][0]] + [31, 32, 33], p)
            for rid, (prompt, p) in first.items()
        }
        if family == "ouro" and not fixed:
            later["a"] = (later["a"][0], msgspec.structs.replace(params[0], exit_threshold=0.3))
        later["shared"] = (FIRST[:12] + [40, 41, 42], params[1])
        return later

    return first, second


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("layout", ["last_exited", "shared"])
@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_second_turns_equal_the_cache_off_run(checkpoints, family, layout, fixed):
    mc, new_engine = make(checkpoints[family], family, layout)
    D = mc.depth
    on, off = new_engine(), new_engine(enable_prefix_caching=False)
    first, second = turns(family, fixed)
    one = drive(on, mc, first)
    assert_same(one, drive(off, mc, first), family)
    assert {c for _, c in one.values()} == {0}
    later = second(one)
    got, ref = drive(on, mc, later), drive(off, mc, later)
    assert_same(got, ref, family)
    for rid in first:
        want = expected_hit(known(first[rid][0], one[rid][0], D), later[rid][0], D)
        # its whole first prompt at least
        assert got[rid][1] == want >= len(first[rid][0]) // BS * BS, rid
        assert ref[rid][1] == 0
    generated = [got[r][1] - len(first[r][0]) // BS * BS for r in first]
    if fixed:  # every generated position ran at full depth: whole blocks of them are reused
        assert min(generated) >= BS
    elif family == "ouro":  # an early exit ends the match at its block
        assert any(got[r][1] < len(later[r][0]) - 1 - BS for r in first)
    # the seeded request shares the first prompt's first 12 tokens; Huginn's like-init KV depends on
    # the seed (the first turn's was greedy: state seed 0), the other families' does not
    assert got["shared"][1] == (0 if family == "huginn" else 12)
    assert on.num_free_blocks == on.pool.num_blocks and on.pool.prefix.size > 0
    assert on.pool.prefix.hit_tokens == sum(c for _, c in got.values())
    assert on.pool.prefix.queried_tokens == sum(
        len(p) for p, _ in list(first.values()) + list(later.values())
    )


def test_eviction_under_a_small_pool(checkpoints):
    """A pool too small to keep every cached block: the least recently released go first (a
    prefix's tail before its head), never one in use, and what is found is still exact."""
    mc, new_engine = make(checkpoints["ouro"], "ouro")
    sp = SamplingParams(
        max_tokens=6, temperature=0, ignore_eos=True, exit_threshold=1.0, logprobs=2
    )
    small = new_engine(num_blocks=4 * 12)  # 12 logical blocks of 4 planes
    off = new_engine(enable_prefix_caching=False)
    evicted = []
    evict = PrefixCache.evict
    small.pool.prefix.evict = lambda: evicted.append(1) or evict(small.pool.prefix)
    drive(small, mc, {"a": (FIRST, sp)})  # 18 + 6 positions: 6 blocks cached
    assert small.pool.prefix.size == 5  # (the last position never ran: 23 final positions)
    # 34 + 6 positions need 10 blocks, 7 are free: 3 cached blocks go, the last ones of the prefix
    # first
    drive(small, mc, {"x": (OTHER * 3 + [1], sp)})
    assert len(evicted) == 3
    reqs = {"again": (FIRST + [50], sp)}
    got, ref = drive(small, mc, reqs), drive(off, mc, reqs)
    assert_same(got, ref, "ouro")
    assert got["again"][1] == 8  # the head of the prefix survived, its tail did not
    assert small.num_free_blocks == small.pool.num_blocks


def test_a_block_in_use_is_shared_not_evicted(checkpoints):
    """Requests running at once share the cached prompt blocks of one admitted before them: the
    blocks are held once, and a pool that needs room evicts only unused ones."""
    mc, new_engine = make(checkpoints["nanbeige"], "nanbeige", prefill_chunk=1000)
    engine = new_engine()
    sp = resolve_params(mc, 18, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    engine.add_request("first", FIRST, sp)
    engine.step()  # its prompt's 2 loops
    engine.step()
    engine.add_request("second", FIRST[:17] + [99], sp)
    engine.step()
    first, second = (
        next(s for s in engine.running if s.request_id == r) for r in ("first", "second")
    )
    assert second.num_cached_tokens == 16 and second.tables.core[0][:4] == first.tables.core[0][:4]
    assert second.tables.core[0][4] != first.tables.core[0][4]
    held = {b for s in (first, second) for t in s.tables.core for b in t}
    # shared blocks count once, as in use
    assert engine.num_free_blocks == engine.pool.num_blocks - len(held)
    assert engine.pool.prefix.num_unused == 0  # (so no eviction can take them)
    while engine.has_work():
        engine.step()
    assert engine.num_free_blocks == engine.pool.num_blocks


def test_cache_off_and_warm_up_leave_no_cached_blocks(checkpoints):
    mc, new_engine = make(checkpoints["ouro"], "ouro")
    engine = new_engine(enable_prefix_caching=False)
    drive(engine, mc, {"a": (FIRST, SamplingParams(max_tokens=3, temperature=0))})
    assert engine.pool.prefix is None and engine.pool.num_cached == 0
    on = new_engine()
    drive(on, mc, {"a": (FIRST, SamplingParams(max_tokens=3, temperature=0))})
    assert on.pool.num_cached == 5 * 4  # 18 + 2 positions known: 5 blocks of 4 planes
    assert on.pool.prefix.queried_tokens == 18
    on.pool.clear_cache()  # (as warm-up does)
    assert on.pool.num_cached == 0 and on.num_free_blocks == on.pool.num_blocks
    assert on.pool.prefix.queried_tokens == on.pool.prefix.hit_tokens == 0


def test_float64_hits_are_bit_exact(checkpoints):
    """In float64 the passes are exact enough that a hit changes no logprob at all."""
    mc, new_engine = make(checkpoints["ouro"], "ouro", dtype=torch.float64)
    on, off = new_engine(), new_engine(enable_prefix_caching=False)
    first, second = turns("ouro", False)
    one = drive(on, mc, first)
    drive(off, mc, first)
    later = second(one)
    got, ref = drive(on, mc, later), drive(off, mc, later)
    assert {r: o for r, (o, _) in got.items()} == {r: o for r, (o, _) in ref.items()}
    assert all(got[r][1] > 0 for r in first)


# ---- through the engine's processes --------------------------------------------------------------


async def two_turns(path, family, topology, **opts):
    """First turns together, then second turns (each first prompt + its output + new tokens, and a
    request sharing a first prompt's head). -> (first, second finals, engine stats)."""
    async with rlt.Engine.launch(
        path, topology=topology, hf_overrides=OV.get(family), **(SMALL | FAST_PD | opts)
    ) as e:

        async def run(reqs):
            async def one(i, p, sp):
                async for out in e.generate(p, sp, request_id=f"q{i}"):
                    pass
                return out

            return await asyncio.gather(*(one(i, p, sp) for i, (p, sp) in enumerate(reqs)))

        first = pd_requests(family)
        one = await run(first)
        second = [(p + o.token_ids + [61, 62], sp) for (p, sp), o in zip(first, one)]
        second.append((first[0][0][:9] + [70, 71], first[0][1]))
        two = await run(second)
        await all_free(e)
        return one, two, e.stats()


@pytest.mark.parametrize(
    "family,layout",
    [
        ("ouro", "last_exited"),
        ("ouro", "shared"),
        ("nanbeige", "last_exited"),
        ("huginn", "last_exited"),
    ],
)
async def test_second_turns_through_single_and_1p1d_equal_the_cache_off_run(
    checkpoints, family, layout
):
    """The prefill worker serves a hit from its cache and writes the cached blocks to the decode
    worker with the computed ones: tokens and depths equal single's with the cache off."""
    path = checkpoints[family]
    _, ref, _ = await two_turns(
        path, family, "single", kv_layout=layout, enable_prefix_caching=False
    )
    tol = 1e-3 if family == "huginn" else 1e-4
    for topology in ("single", "1p1d"):
        one, two, st = await two_turns(path, family, topology, kv_layout=layout)
        assert [o.num_cached_tokens for o in one] == [0] * len(one)
        for a, b in zip(two, ref):
            assert (a.token_ids, a.exit_depths, a.finish_reason) == (
                b.token_ids,
                b.exit_depths,
                b.finish_reason,
            )
            for x, y in zip(a.logprobs or (), b.logprobs or ()):
                assert x.keys() == y.keys() and max(abs(x[k] - y[k]) for k in x) < tol
        # every second turn reuses at least its first prompt's full blocks (all of them at fixed
        # depth)
        assert all(
            o.num_cached_tokens >= len(p) // 4 * 4 for o, (p, _) in zip(two, pd_requests(family))
        )
        assert two[-1].num_cached_tokens == 8 and b.num_cached_tokens == 0
        runs_prompts = [w for w in st.workers if w.role in ("unified", "prefill")]
        assert sum(w.prefix_cache.hit_tokens for w in runs_prompts) == sum(
            o.num_cached_tokens for o in two
        )
        assert 0 < st.prefix_cache.hit_rate < 1


async def test_replicas_route_a_prompt_to_the_worker_holding_its_prefix(checkpoints):
    sp = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    async with rlt.Engine.launch(checkpoints["ouro"], topology="2x", **(SMALL | FAST_PD)) as e:

        async def final(prompt, params=sp, rid=None):
            async for out in e.generate(prompt, params, request_id=rid):
                pass
            return out

        def worker_of(rid):
            return e._lifecycle.live[rid].decode.worker.pid

        await final(FIRST)  # on the first replica (both idle: the first wins the tie)
        long = e.generate(OTHER, SamplingParams(max_tokens=200, ignore_eos=True), request_id="long")
        busy = worker_of("long")
        # the least loaded replica is now the other one; the prefix is on the busy one
        again = e.generate(FIRST + [1, 2], sp, request_id="again")
        assert worker_of("again") == busy
        fresh = e.generate([9] * 20, sp, request_id="fresh")
        assert worker_of("fresh") != busy
        async for out in again:
            pass
        assert out.num_cached_tokens == 16
        async for _ in fresh:
            pass
        await e.abort("long")
        await long.aclose()


def test_a_burst_sharing_a_new_prefix_computes_it_once(checkpoints):
    """Requests arriving together with the same uncached prompt head: the first computes it, the
    others wait until its blocks are cached and start after them (one behind them sharing nothing
    does not wait); every stream equals the cache-off run's."""
    mc, new_engine = make(checkpoints["ouro"], "ouro")
    sp = SamplingParams(
        max_tokens=5, temperature=0, ignore_eos=True, exit_threshold=0.5, logprobs=2
    )
    reqs = {
        "a": (FIRST, sp),
        "b": (FIRST[:17] + [60, 61], sp),
        "c": (FIRST + [62], sp),
        "other": (OTHER, sp),
    }
    engine = new_engine()
    admitted, seqs = {}, {}  # a's final positions when each was admitted
    admit = engine.sched._admit

    def spy():
        done = admit()
        for s in engine.running:
            seqs.setdefault(s.request_id, s)
            admitted.setdefault(s.request_id, seqs["a"].num_done)
        return done

    engine.sched._admit = spy
    got, ref = drive(engine, mc, reqs), drive(new_engine(enable_prefix_caching=False), mc, reqs)
    assert_same(got, ref, "ouro")
    assert {r: c for r, (_, c) in got.items()} == {"a": 0, "b": 16, "c": 16, "other": 0}
    # b and c came in once a's first 16 positions were final; `other`, behind them, at once
    assert admitted["a"] == admitted["other"] == 0 and admitted["b"] >= 16 and admitted["c"] >= 16


def test_a_cold_prompt_is_admitted_having_hashed_one_block_key(checkpoints):
    """The lookup hashes a prompt's block keys in doubling runs up to the first miss: a cold prompt
    of 4 full blocks starts its first pass with one key hashed (the rest as its blocks are cached);
    its second turn hashes 1, 2, then 4 and hits all 4 blocks."""
    mc, new_engine = make(checkpoints["ouro"], "ouro")
    engine = new_engine()
    sp = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    engine.add_request("a", FIRST, resolve_params(mc, len(FIRST), sp))
    engine.step()
    (first,) = engine.running
    assert len(first.keys) == 1  # its pass is in flight: nothing of it is cached yet
    while engine.has_work():
        engine.step()
    assert len(first.keys) == len(FIRST) // BS
    got = drive(engine, mc, {"b": (FIRST + [1, 2], sp)})
    assert got["b"][1] == 4 * BS


def test_routing_prefers_the_prefix_holder_unless_it_is_much_busier_or_unusable():
    from types import SimpleNamespace

    from rlt.control import router
    from rlt.control.worker_proc import Credits, PrefixIndex

    def worker(name, slots):
        ready = SimpleNamespace(kv_blocks_total=400, kv_planes=4)
        return SimpleNamespace(
            identity=name, ready=ready, credits=Credits(0, slots), prefixes=PrefixIndex()
        )

    keys = [b"k0", b"k1", b"k2"]
    holder, idle = worker("holder", 5), worker("idle", 0)
    router.remember(holder, keys[:2])
    assert router.by_prefix([holder, idle], keys) is holder
    # nothing cached anywhere: least loaded
    assert router.by_prefix([holder, idle], [b"other"]) is idle
    # (its queue is full)
    assert router.by_prefix([holder, idle], keys, usable=lambda w: w is idle) is idle
    holder.credits.slots = 60  # over 32 more in flight than the least loaded, and over 1.5x
    assert router.by_prefix([holder, idle], keys) is idle
    idle.credits.slots = 30
    assert router.by_prefix([holder, idle], keys) is holder
    small = PrefixIndex()
    small.add([b"a", b"b", b"c"], capacity=2)  # the head is kept, as the worker keeps it
    assert small.match([b"a", b"b"]) == 2 and small.match([b"c"]) == 0


def test_keys_chain_tokens_and_depths_block_by_block():
    """Position P + i is keyed by the token fed there (output[i]) and the depth of the token sampled
    from it (depths[i + 1]); prompt positions by full depth; the root by the state seed only where
    the initial latent is drawn from it."""
    from rlt.workers.prefix_cache import chain, root_key
    from rlt.workers.sequence import Sequence

    root = root_key(False, 0)
    s = Sequence(
        1, list(range(10)), None, (0, 0), root=root, output=[50, 51, 52, 53], depths=[4, 2, 4, 1]
    )
    assert s.known_positions == 13  # position 13 (fed 53) has not run: its depth is unknown
    tokens, depths = list(range(10)) + [50, 51, 52], [4] * 10 + [2, 4, 1]
    want, parent = [], root
    for b in range(3):
        parent = chain(parent, tokens[4 * b : 4 * b + 4], depths[4 * b : 4 * b + 4])
        want.append(parent)
    assert s.block_keys(9, 4, 4) == want[:2] and s.block_keys(13, 4, 4) == want
    other = Sequence(
        1, list(range(10)), None, (0, 0), root=root, output=[50, 51, 52], depths=[4, 3, 4]
    )
    assert other.block_keys(12, 4, 4) == want[:2] + [chain(want[1], tokens[8:12], [4, 4, 3, 4])]
    assert (
        root_key(True, 1) != root_key(True, 2) and root_key(False, 1) == root_key(False, 2) == root
    )
