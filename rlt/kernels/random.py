"""Counter-based random numbers: a value is a pure function of its coordinates.

Sampling noise and Huginn's initial latent must not depend on batch composition, device or
worker, so nothing here has state: uniform(seed, stream, counter, index) hashes its integer
coordinates with a 32-bit avalanche hash (lowbias32), written in int64 torch ops so it runs
identically on CPU and GPU. random_bits_rows is the [rows, columns] grid the engine draws (a seed and
a counter per row, the column as the index): a worker's layer operations take it from here or from
its Triton kernel (rlt/kernels/random_triton.py), bit for bit the same.
"""

import math

import torch

_MASK32 = 0xFFFFFFFF

# Streams keep independent uses of one seed apart.
STREAM_SAMPLING = 1
STREAM_STATE_INIT = 2


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32), exact in int64 (split c in 16-bit halves)."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def random_bits(
    seed: torch.Tensor, stream: int, counter: torch.Tensor, index: torch.Tensor
) -> torch.Tensor:
    """32 random bits per element; arguments broadcast. seed may be any int64 (both halves used)."""
    seed = seed.to(torch.int64)
    h = _hash32(index.to(torch.int64) + 0x9E3779B9)
    h = _hash32(h ^ (counter.to(torch.int64) & _MASK32))
    h = _hash32(h ^ ((counter.to(torch.int64) >> 32) & _MASK32) ^ (stream * 0x85EBCA6B & _MASK32))
    h = _hash32(h ^ (seed & _MASK32))
    return _hash32(h ^ ((seed >> 32) & _MASK32))


def random_bits_rows(
    seed: torch.Tensor, stream: int, counter: torch.Tensor, columns: int
) -> torch.Tensor:
    """random_bits(seed[:, None], stream, counter[:, None], arange(columns)[None]): [R, columns]."""
    index = torch.arange(columns, device=seed.device).unsqueeze(0)
    return random_bits(seed.unsqueeze(1), stream, counter.unsqueeze(1), index)


def uniform_of(bits: torch.Tensor) -> torch.Tensor:
    """Float64 uniform in the open interval (0, 1), 32 bits of resolution."""
    return (bits.to(torch.float64) + 0.5) * (1.0 / 2**32)


def gumbel_of(bits: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise in float32 from bits of the sampling stream."""
    return (-torch.log(-torch.log(uniform_of(bits)))).to(torch.float32)


def gumbel(seed, counter, index) -> torch.Tensor:
    return gumbel_of(random_bits(seed, STREAM_SAMPLING, counter, index))


def truncated_normal(seed, counter, index, bound: float = 3.0) -> torch.Tensor:
    return truncated_normal_of(random_bits(seed, STREAM_STATE_INIT, counter, index), bound)


def truncated_normal_of(bits: torch.Tensor, bound: float = 3.0) -> torch.Tensor:
    """Standard normal truncated to [-bound, bound] by inverse CDF, float64, from bits of the
    state-init stream."""
    u = uniform_of(bits)
    lo = 0.5 * (1.0 + math.erf(-bound / math.sqrt(2.0)))
    hi = 0.5 * (1.0 + math.erf(bound / math.sqrt(2.0)))
    p = lo + u * (hi - lo)
    return math.sqrt(2.0) * torch.erfinv(2.0 * p - 1.0)
