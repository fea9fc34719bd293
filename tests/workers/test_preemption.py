"""Blocks on demand: a request holds the blocks of the positions it has reached; when the pool runs
out the newest request is preempted and later resumed by recompute (the prompt at full depth, each
generated position at the depth its token exited at), and its stream is exactly the unpreempted one."""

import msgspec
import pytest
import torch

from rlt import RequestError
from rlt.contract.sampling_params import SamplingParams
from rlt.contract.validation import resolve_params
from tests.workers.helpers import PROMPTS, make, mixed_params, run, spy_preemptions


def workload(family, fixed: bool):
    """Four requests (greedy and seeded, adaptive exit unless `fixed`), 14 tokens each."""
    params = [msgspec.structs.replace(p, max_tokens=14) for p in mixed_params(family)]
    if fixed:
        params = [msgspec.structs.replace(p, exit_threshold=None, min_loops=None) for p in params]
    prompts = PROMPTS + [[9, 8, 7, 6, 5, 4, 3, 2, 1]]
    return {str(i): (prompts[i], params[i % 3]) for i in range(4)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("layout", ["last_exited", "shared"])
@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_preempted_requests_resume_exactly(checkpoints, family, layout, fixed, dtype):
    """Tokens, exit depths and finish reasons equal the unpreempted run's; logprobs too in float64,
    and to float32 rounding in float32 (the recomputed rows share passes with other rows: another
    GEMM order; Huginn's many sandwich norms accumulate the most)."""
    mc, new_engine = make(checkpoints[family], family, layout, dtype=dtype)
    reqs = workload(family, fixed)
    alone = run(new_engine(), mc, reqs)
    # a pool that holds the largest request alone (13 + 14 positions) and little more
    small = new_engine(num_blocks=1)
    per_plane = small.pool.num_core_planes + int(small.pool.has_boundary)
    engine = new_engine(num_blocks=per_plane * 8)
    seen = spy_preemptions(engine)
    got = run(engine, mc, reqs, arrivals={"0": 0, "1": 0, "2": 2, "3": 5})
    assert engine.preemptions >= 2 and max(seen) >= 3  # generated positions were recomputed
    assert engine.num_free_blocks == engine.pool.num_blocks and not engine.has_work()
    tol = 0.0 if dtype == torch.float64 else 1e-3 if family == "huginn" else 1e-4
    for rid, outs in alone.items():
        assert [(o[0], o[1], o[3]) for o in got[rid]] == [(o[0], o[1], o[3]) for o in outs], rid
        for (_, _, a, _), (_, _, b, _) in zip(got[rid], outs):
            assert (a or {}).keys() == (b or {}).keys() and all(
                abs(a[t] - b[t]) <= tol for t in a or ()
            )
    if family == "ouro" and not fixed:
        assert len({o[1] for outs in alone.values() for o in outs}) >= 2  # exits really vary


def test_admission_counts_blocks_in_use_not_max_tokens(checkpoints):
    """Four requests whose prompt + max_tokens would fit one at a time all run at once; the one
    that can never fit, even alone, is refused with the block arithmetic."""
    mc, new_engine = make(checkpoints["nanbeige"], "nanbeige", num_blocks=16, max_num_seqs=8)
    engine = new_engine()
    sp = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    for i in range(4):  # 4 + 20 positions: 6 blocks per plane, 12 blocks each; 16 in the pool
        engine.add_request(str(i), [1, 2, 3, 4], resolve_params(mc, 4, sp))
    engine.step()
    assert len(engine.running) == 4 and engine.num_free_blocks == 16 - 4 * 4
    while engine.has_work():
        engine.step()
    assert engine.preemptions > 0 and engine.num_free_blocks == 16
    big = resolve_params(mc, 4, SamplingParams(max_tokens=29))
    with pytest.raises(
        RequestError, match="can never fit: prompt 4 \\+ max_tokens 29 needs 18 KV blocks"
    ):
        engine.add_request("big", [1, 2, 3, 4], big)


def test_preemption_takes_the_lowest_priority_then_the_newest(checkpoints):
    mc, new_engine = make(checkpoints["nanbeige"], "nanbeige", num_blocks=16)
    engine = new_engine()
    seen = []
    preempt = engine.sched.preempt
    engine.sched.preempt = lambda s: (seen.append(s.request_id), preempt(s))
    sp = resolve_params(mc, 4, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    engine.add_request("old", [1, 2, 3, 4], sp, priority=1)
    engine.add_request("urgent", [1, 2, 3, 4], sp, priority=0)
    engine.add_request("new", [1, 2, 3, 4], sp, priority=1)
    finished = []
    while engine.has_work():
        finished += [o.request_id for o in engine.step() if o.finish_reason]
    assert seen[0] == "new" and "urgent" not in seen and finished[0] == "urgent"
