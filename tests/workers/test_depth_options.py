"""A request's depth options apply to its prompt as the families' references apply them (issue 33,
item 3): max_loops = min_loops = k below the model's depth computes the prompt at depth k and the
first token from depth k. Huginn: equal to the authors' `generate_with_adaptive_compute` with
`num_steps=k` (tests/workers/huginn_reference.json, made by dev/huginn_reference.py; through 1p1d:
tests/workers/test_exit_criteria.py); Ouro and Nanbeige: equal to the dense reference run at depth k
(tests/reference.py). The prefix cache keys prompt blocks by that depth."""

from types import SimpleNamespace

import pytest

from rlt.contract.sampling_params import SamplingParams
from rlt.contract.validation import resolve_params
from tests.models.helpers import Generated, assert_matches
from tests.reference import Ref, ref_generate
from tests.workers.helpers import make, run
from tests.workers.huginn_cases import FIXED, FIXTURE, N


def fixed(k: int, n: int = N) -> SamplingParams:
    return SamplingParams(
        max_tokens=n, temperature=0, ignore_eos=True, logprobs=3, min_loops=k, max_loops=k
    )


def tokens_depths(out: list) -> tuple[list[int], list[int]]:
    return [o[0] for o in out], [o[1] for o in out]


def test_huginn_fixed_depth_equals_the_authors_code(checkpoints):
    """num_steps=k at 1, 3 and 5 of 8: one at a time and all at once (one pass, three depths)."""
    mc, engine = make(
        checkpoints["huginn"], "huginn", overrides=FIXTURE["overrides"], enable_prefix_caching=False
    )
    assert mc.depth == 8 and {c["num_steps"] for c in FIXED} == {1, 3, 5}
    reqs = {i: (c["prompt"], fixed(c["num_steps"])) for i, c in enumerate(FIXED)}
    together = run(engine(), mc, reqs)
    for i, c in enumerate(FIXED):
        alone = run(engine(), mc, {i: reqs[i]})[i]
        assert tokens_depths(alone) == tokens_depths(together[i]) == (c["tokens"], c["depths"])


DENSE = [("ouro", "total_ut_steps", 2), ("ouro", "total_ut_steps", 3), ("nanbeige", "num_loops", 1)]


@pytest.mark.parametrize("family,key,k", DENSE)
def test_fixed_depth_equals_the_dense_reference_at_that_depth(checkpoints, family, key, k):
    """Ouro's output of loop k (its gate unused) and Nanbeige's at k loops: the reference model with
    its depth set to k, token for token, logprobs to 1e-4."""
    mc, engine = make(checkpoints[family], family, enable_prefix_caching=False)
    assert k < mc.depth
    prompts = [[11, 42, 7, 300, 19, 5, 88, 250, 3], [100, 200, 300, 400, 6, 7]]
    out = run(engine(), mc, {i: (p, fixed(k, 6)) for i, p in enumerate(prompts)})
    ref = Ref(checkpoints[family], {key: k})
    for i, p in enumerate(prompts):
        tokens, depths, logps = ref_generate(ref, p, 6)
        assert depths == [k] * 6
        got = Generated(
            [SimpleNamespace(token_id=t, exit_depth=d, logprobs=lp) for t, d, lp, _ in out[i]]
        )
        assert_matches(got, tokens, depths, logps)


def test_prefix_cache_keys_prompt_blocks_by_their_depth(checkpoints):
    """A prompt cached at depth 3 serves the same prompt at depth 3, not at full depth (nor the
    other way round); either way the tokens are the authors'."""
    mc, engine = make(checkpoints["huginn"], "huginn", overrides=FIXTURE["overrides"])
    e = engine()
    case = next(c for c in FIXED if c["num_steps"] == 3)
    full = next(
        c for c in FIXTURE["cases"] if c["prompt"] == case["prompt"] and c["threshold"] == "auto"
    )
    assert full["depths"] == [8] * N  # ("auto" never exits on these weights: full depth)
    # (whole blocks, never the last position)
    prompt, hit = case["prompt"], len(case["prompt"]) // 4 * 4

    def first_cached(rid, sp):
        out = {}
        e.add_request(rid, prompt, resolve_params(mc, len(prompt), sp))
        while e.has_work():
            for o in e.step():
                out.setdefault("cached", o.num_cached_tokens)
                out.setdefault("tokens", []).append((o.token_id, o.exit_depth))
        return out["cached"], [t for t, _ in out["tokens"]], [d for _, d in out["tokens"]]

    assert first_cached("a", fixed(3)) == (0, case["tokens"], case["depths"])
    assert first_cached("b", fixed(8)) == (0, full["tokens"], full["depths"])
    assert first_cached("c", fixed(3)) == (hit, case["tokens"], case["depths"])
    assert first_cached("d", fixed(8)) == (hit, full["tokens"], full["depths"])
