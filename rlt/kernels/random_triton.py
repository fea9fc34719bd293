"""Triton kernel of rlt/kernels/random.py's random_bits over a [rows, columns] grid (a seed and a
counter per row, the column as the index): the same 32-bit hash in uint32 arithmetic (wrapping
multiply, logical shifts), so its bits equal the int64 torch reference's exactly, in one launch
instead of some fifty elementwise ones (Huginn's initial latent of a pass's new rows; sampling's
Gumbel noise)."""

import torch
import triton
import triton.language as tl

BLOCK = 1024  # columns per program


@triton.jit
def _hash32(x):
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _bits_kernel(out_ptr, seed_ptr, counter_ptr, stream_key, C, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    seed = tl.load(seed_ptr + r)
    counter = tl.load(counter_ptr + r)
    seed_lo, seed_hi = (seed & 0xFFFFFFFF).to(tl.uint32), ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    ctr_lo, ctr_hi = (
        (counter & 0xFFFFFFFF).to(tl.uint32),
        ((counter >> 32) & 0xFFFFFFFF).to(tl.uint32),
    )
    h = _hash32(cols.to(tl.uint32) + 0x9E3779B9)
    h = _hash32(h ^ ctr_lo)
    h = _hash32(h ^ ctr_hi ^ stream_key.to(tl.uint32))
    h = _hash32(h ^ seed_lo)
    h = _hash32(h ^ seed_hi)
    tl.store(out_ptr + r * C + cols, h.to(tl.int64), mask=cols < C)


def random_bits_rows(
    seed: torch.Tensor, stream: int, counter: torch.Tensor, columns: int
) -> torch.Tensor:
    """random_bits(seed[:, None], stream, counter[:, None], arange(columns)[None]) -> [R, columns]
    int64; seed and counter [R] (any integer dtype)."""
    R = seed.shape[0]
    out = torch.empty(R, columns, dtype=torch.int64, device=seed.device)
    if R:
        key = stream * 0x85EBCA6B & 0xFFFFFFFF
        grid = (R, triton.cdiv(columns, BLOCK))
        _bits_kernel[grid](
            out, seed.to(torch.int64), counter.to(torch.int64), key, columns, BLOCK=BLOCK
        )
    return out
