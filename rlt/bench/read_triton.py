"""A streaming read-only kernel: the read ceiling of rlt/bench/floors.py (decode reads weights and KV,
and writes little)."""

import triton
import triton.language as tl


@triton.jit
def read_kernel(src, sums, n, BLOCK: tl.constexpr):
    """Program p sums src's BLOCK-element tiles p, p + programs, ... (loads past L1: .cg) into sums[p]."""
    pid, programs = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(pid * BLOCK, n, programs * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < n, other=0, cache_modifier=".cg").to(tl.int64)
    tl.store(sums + pid, tl.sum(acc))
