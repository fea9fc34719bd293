"""Triton kernel of rlt/kernels/lane_checks.py: one program per lane (its row in blocks of columns:
the state chosen and written, the criterion's sums, its previous state replaced), counts by atomics."""

import torch
import triton
import triton.language as tl

from rlt.kernels.lane_checks import COSINE, LATENT_DIFF


@triton.jit
def _latent_checks_kernel(
    out_ptr,
    x_ptr,
    run_ptr,
    depth_ptr,
    crit_ptr,
    min_ptr,
    max_ptr,
    thr_ptr,
    pd_ptr,
    pc_ptr,
    parked_ptr,
    active_ptr,
    counts_ptr,
    H,
    LD: tl.constexpr,
    COS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    lane = tl.program_id(0).to(tl.int64)
    run = tl.load(run_ptr + lane) != 0
    depth = tl.load(depth_ptr + lane) + run.to(tl.int64)
    crit = tl.load(crit_ptr + lane)
    checked = run & (depth >= tl.load(min_ptr + lane)) & (depth < tl.load(max_ptr + lane))
    diff_mine = (checked & (crit == LD)).to(tl.int32)
    cos_mine = (checked & (crit == COS)).to(tl.int32)
    dd = tl.zeros([BLOCK], dtype=tl.float32)
    xx = tl.zeros([BLOCK], dtype=tl.float32)
    xp = tl.zeros([BLOCK], dtype=tl.float32)
    pp = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(0, H, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        m = k < H
        md = m & (k * 0 + diff_mine != 0)  # (a block: the interpreter takes no scalar into a mask)
        mc = m & (k * 0 + cos_mine != 0)
        new = tl.load(out_ptr + lane * H + k, mask=m, other=0.0)
        old = tl.load(x_ptr + lane * H + k, mask=m, other=0.0)
        s = tl.where(run, new, old)
        tl.store(out_ptr + lane * H + k, s, mask=m)
        f = s.to(tl.float32)
        p = tl.load(pd_ptr + lane * H + k, mask=md, other=0.0)
        p += tl.load(pc_ptr + lane * H + k, mask=mc, other=0.0)
        dd += (f - p) * (f - p)
        xx += f * f
        xp += f * p
        pp += p * p
        tl.store(pd_ptr + lane * H + k, f, mask=md)
        tl.store(pc_ptr + lane * H + k, f, mask=mc)
    # (IEEE-rounded square roots and quotients, as torch's: only the sums' order differs)
    nx = tl.sqrt_rn(tl.sum(xx, axis=0))
    thr = tl.load(thr_ptr + lane)
    hold_diff = tl.div_rn(tl.sqrt_rn(tl.sum(dd, axis=0)), nx) < thr
    hold_cos = (
        1 - tl.div_rn(tl.div_rn(tl.sum(xp, axis=0), nx), tl.sqrt_rn(tl.sum(pp, axis=0))) < thr
    )
    exits = ((diff_mine != 0) & hold_diff) | ((cos_mine != 0) & hold_cos)
    parked = (tl.load(parked_ptr + lane) != 0) | (
        run & (exits | (depth >= tl.load(max_ptr + lane)))
    )
    active = (tl.load(active_ptr + lane) != 0).to(tl.int32)
    tl.store(depth_ptr + lane, depth)
    tl.store(parked_ptr + lane, parked.to(tl.int8))
    tl.atomic_add(counts_ptr, active * (1 - parked.to(tl.int32)))
    tl.atomic_add(counts_ptr + 1, active * parked.to(tl.int32))


def latent_checks(
    out, x, run, depth, crit, min_loops, max_loops, threshold, prev_diff, prev_cos, parked, active
):
    L, H = out.shape
    counts = torch.zeros(2, dtype=torch.int32, device=out.device)
    for t in (
        out,
        x,
        depth,
        crit,
        min_loops,
        max_loops,
        threshold,
        prev_diff,
        prev_cos,
        parked,
        active,
        run,
    ):
        assert t.is_contiguous()
    _latent_checks_kernel[(L,)](
        out,
        x,
        run.view(torch.int8),
        depth,
        crit,
        min_loops,
        max_loops,
        threshold,
        prev_diff,
        prev_cos,
        parked.view(torch.int8),
        active.view(torch.int8),
        counts,
        H,
        LD=LATENT_DIFF,
        COS=COSINE,
        BLOCK=min(triton.next_power_of_2(H), 2048),
    )
    return counts
