"""Triton kernels of rlt/kernels/penalties.py: one program per penalized row, one launch each.

Rounding follows the torch reference: IEEE division, no fused multiply-add. Integer arguments are
fixed per engine (strides, vocabulary, list width), so one specialization serves every launch.
"""

import triton
import triton.language as tl

BLOCK = 256  # listed tokens per iteration


@triton.jit
def _penalize_kernel(
    x_ptr,
    stride_x,
    rows_ptr,
    slots_ptr,
    rep_ptr,
    freq_ptr,
    pres_ptr,
    tokens_ptr,
    counts_ptr,
    length_ptr,
    L,
    V,
    PROMPT_BIT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    p = tl.program_id(0)
    row = tl.load(rows_ptr + p).to(tl.int64)
    slot = tl.load(slots_ptr + p).to(tl.int64)
    r, f, pr = tl.load(rep_ptr + p), tl.load(freq_ptr + p), tl.load(pres_ptr + p)
    n = tl.load(length_ptr + slot)
    for j0 in range(0, n, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        m = j < n
        t = tl.load(tokens_ptr + slot * L + j, mask=m, other=0).to(tl.int64)
        c = (tl.load(counts_ptr + slot * V + t, mask=m, other=0) & (PROMPT_BIT - 1)).to(tl.float32)
        ptr = x_ptr + row * stride_x + t
        logit = tl.load(ptr, mask=m, other=0.0)
        v = tl.where(logit > 0, tl.math.div_rn(logit, r), logit * r)
        v = v - f * c
        v = v - pr * (c > 0).to(tl.float32)
        tl.store(ptr, v, mask=m)


@triton.jit
def _append_kernel(
    sampled_ptr,
    keep_ptr,
    rows_ptr,
    slots_ptr,
    tokens_ptr,
    counts_ptr,
    length_ptr,
    L,
    V,
    KEEP: tl.constexpr,
):
    p = tl.program_id(0)
    row = tl.load(rows_ptr + p).to(tl.int64)
    slot = tl.load(slots_ptr + p).to(tl.int64)
    t = tl.load(sampled_ptr + row).to(tl.int64)
    if KEEP:
        keep = tl.load(keep_ptr + row) != 0
    else:
        keep = True
    cptr = counts_ptr + slot * V + t
    c = tl.load(cptr)
    tl.store(cptr, c + 1, mask=keep)
    new = keep & (c == 0)
    end = tl.load(length_ptr + slot)
    tl.store(tokens_ptr + slot * L + end, t.to(tl.int32), mask=new)
    tl.store(length_ptr + slot, end + 1, mask=new)


def penalize_slots(
    x, rows, slots, repetition, frequency, presence, tokens, counts, length, prompt_bit
) -> None:
    """prompt_bit: counts' prompt bit (rlt/kernels/penalties.py's PROMPT, passed: that module imports this one)."""
    if rows.numel():
        args = (
            repetition,
            frequency,
            presence,
            tokens,
            counts,
            length,
            tokens.stride(0),
            counts.stride(0),
        )
        _penalize_kernel[(rows.numel(),)](
            x, x.stride(0), rows, slots, *args, prompt_bit, BLOCK, enable_fp_fusion=False
        )


def append_slots(sampled, keep, rows, slots, tokens, counts, length) -> None:
    if rows.numel():
        keep_arg = keep if keep is not None else sampled
        _append_kernel[(rows.numel(),)](
            sampled,
            keep_arg,
            rows,
            slots,
            tokens,
            counts,
            length,
            tokens.stride(0),
            counts.stride(0),
            keep is not None,
        )
