"""Exit criteria under the SHARED layout, where a position's one K/V plane must keep the K/V of
the loop its token exited at: the pass after an exit (the host reads criterion verdicts one pass
late) holds the exited row, whose K/V then goes to the scratch block (rlt/workers/exit_criteria.py).
The position-by-position reference, given rlt's exit depths, gives the same tokens and logprobs."""

import pytest

from rlt.contract.sampling_params import SamplingParams
from tests.reference import Ref, shared_generate
from tests.workers.helpers import make, run
from tests.workers.huginn_cases import FIXTURE, VARIED, params


@pytest.mark.parametrize("criterion,wait", [("latent-diff", 0), ("kl", 0), ("latent-diff", 3)])
def test_shared_layout_keeps_the_exit_depths_kv(checkpoints, criterion, wait):
    """wait: exit_wait_passes, beside a request at fixed depth whose rows keep the passes going while
    an exited row parks (its K/V to the scratch block all the while)."""
    case = next(c for c in VARIED if c["criterion"] == criterion)
    opts = dict(enable_prefix_caching=False, exit_wait_passes=wait)
    mc, engine = make(checkpoints["huginn"], "huginn", "shared", FIXTURE["overrides"], **opts)
    sp = params(case)
    sp.logprobs = 5
    fixed = SamplingParams(max_tokens=3 * sp.max_tokens, temperature=0, ignore_eos=True)
    beside = {1: ([7, 8, 9], fixed)} if wait else {}
    got = run(engine(), mc, {0: (case["prompt"], sp)} | beside)[0]
    depths = [o[1] for o in got]
    assert len(set(depths[1:])) >= 2  # exits at different loops, some before the last
    ref = Ref(checkpoints["huginn"], FIXTURE["overrides"])
    tokens, ref_depths, logps = shared_generate(ref, case["prompt"], len(got), exits=depths[1:])
    assert [o[0] for o in got] == tokens and depths == ref_depths
    for o, lp in zip(got, logps):
        for t, v in o[2].items():
            assert abs(v - lp[t].item()) < 1e-3
