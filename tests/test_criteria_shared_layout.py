"""Exit criteria under the SHARED layout, where a position's one K/V plane must keep the K/V of
the loop its token exited at: the pass after an exit (the host reads criterion verdicts one pass
late) holds the exited row, whose K/V then goes to the scratch block (rlt/workers/exit_criteria.py).
The position-by-position reference, given rlt's exit depths, gives the same tokens and logprobs."""

import pytest
from huginn_cases import FIXTURE, VARIED, params
from reference import Ref, shared_generate
from test_engine import make, run


@pytest.mark.parametrize("criterion", ["latent-diff", "kl"])
def test_shared_layout_keeps_the_exit_depths_kv(checkpoints, criterion):
    case = next(c for c in VARIED if c["criterion"] == criterion)
    mc, engine = make(checkpoints["huginn"], "huginn", "shared", FIXTURE["overrides"], enable_prefix_caching=False)
    sp = params(case)
    sp.logprobs = 5
    got = run(engine(), mc, {0: (case["prompt"], sp)})[0]
    depths = [o[1] for o in got]
    assert len(set(depths[1:])) >= 2  # exits at different loops, some before the last
    ref = Ref(checkpoints["huginn"], FIXTURE["overrides"])
    tokens, ref_depths, logps = shared_generate(ref, case["prompt"], len(got), exits=depths[1:])
    assert [o[0] for o in got] == tokens and depths == ref_depths
    for o, lp in zip(got, logps):
        for t, v in o[2].items():
            assert abs(v - lp[t].item()) < 1e-3
