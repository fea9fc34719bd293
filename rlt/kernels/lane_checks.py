"""Huginn's steady decode, after each core pass over the lanes, when no lane has a logit criterion:
the pass's bookkeeping and the latent criteria's checks (rlt/workers/exit_criteria.py) in one
operation, which the Triton kernel (lane_checks_triton.py) runs as one launch for the some thirty
small ones the tensor form takes.

Per lane l (in place): a lane that ran takes the pass's state, its depth grows by one; a lane checked
now (ran, has a criterion, min_loops <= depth < max_loops) compares its state with the one of its
last check (latent-diff: ||x - p|| / ||x|| < threshold; cosine: 1 - cos(x, p) < threshold), which
becomes this state; a lane that ran parks if its check held or it reached max_loops. -> counts
[2]: lanes neither parked nor ended, lanes parked and active.
"""

import torch

LATENT_DIFF, COSINE = 1, 2  # lane criterion ids (exit_criteria order, from 1; 0: fixed depth)


def latent_checks(
    out: torch.Tensor,
    x: torch.Tensor,
    run: torch.Tensor,
    depth: torch.Tensor,
    crit: torch.Tensor,
    min_loops: torch.Tensor,
    max_loops: torch.Tensor,
    threshold: torch.Tensor,
    prev_diff: torch.Tensor,
    prev_cos: torch.Tensor,
    parked: torch.Tensor,
    active: torch.Tensor,
) -> torch.Tensor:
    """out [L, H]: the pass's states (becomes the lanes' states); x [L, H] the states before it;
    run, parked, active [L] bool; depth, crit, min_loops, max_loops [L] int64; threshold [L] float32;
    prev_diff, prev_cos [L, H] float32: each latent criterion's previous state (rows of other lanes
    unused). Updates out, depth, prev_*, parked in place."""
    out.copy_(torch.where(run.unsqueeze(1), out, x))
    depth += run
    checked = run & (depth >= min_loops) & (depth < max_loops)
    xf = out.float()
    exits = torch.zeros_like(run)
    for cid, prev in ((LATENT_DIFF, prev_diff), (COSINE, prev_cos)):
        mine = checked & (crit == cid)
        if cid == LATENT_DIFF:
            hold = (xf - prev).norm(dim=-1) / xf.norm(dim=-1) < threshold
        else:
            hold = 1 - (xf * prev).sum(dim=-1) / xf.norm(dim=-1) / prev.norm(dim=-1) < threshold
        exits |= mine & hold
        prev.copy_(torch.where(mine.unsqueeze(1), xf, prev))
    parked |= run & (exits | (depth >= max_loops))
    return torch.stack([(~parked & active).sum(), (parked & active).sum()]).to(torch.int32)
