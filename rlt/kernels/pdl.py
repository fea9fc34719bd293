"""Programmatic dependent launch (PDL, Hopper and later) for the kernels of a decode pass.

A kernel launched with PDL may be scheduled while the kernel before it on the stream finishes; it
calls griddepcontrol.wait (every write of the previous kernel visible) before touching anything
another kernel writes, then lets its own successor launch. Only launch latency, scheduling and
reads of constant data (the GEMV's first weight tile) overlap, so results are unchanged; a one-row
decode pass is ~300 short launches: with PDL, Ouro-1.4B decodes 12 % faster at concurrency 1 on
an H200 (docs/benchmarks.md). On by default on Hopper and later; RLT_PDL=0 turns it off (A/B
measurements); never on the CPU or under Triton's interpreter.

Each kernel releases its successor before its own wait, not after: the successor is scheduled and
issues its early reads (weights, older keys) while the kernel before this one still runs — the
decode attention's K/V reads overlap the [q; k; v] projection instead of the short RoPE launch
between them. Safe because no kernel reads anything before its wait that a kernel of the pass
writes (tests/test_kernels_compiled.py checks each kernel's early reads): the successor's wait
still waits for this kernel's completion, which comes after this kernel's own wait. Ouro-1.4B at
concurrency 1 on an H200: RoPE alone releasing first, 227.8 / 228.2 tok/s against 224.5 / 223.6
(554c5d3); every kernel, 228.8 on average over five runs against 227.9 (b8821e3, alternating).
RLT_PDL_RELEASE_FIRST=0 waits first (A/B).
"""

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

enabled = os.environ.get("RLT_PDL", "1") != "0"
release_first = os.environ.get("RLT_PDL_RELEASE_FIRST", "1") != "0"
RELEASE_FIRST = 2  # the PDL constexpr's value for a kernel releasing the next one before its wait
_RELEASE_FIRST = tl.constexpr(RELEASE_FIRST)  # the same, for kernels


@functools.cache
def _supported(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def launch(kernel, grid, *args, like: torch.Tensor, **kwargs) -> None:
    """kernel[grid](*args, **kwargs) with its PDL constexpr set (0 off, 1 wait first, RELEASE_FIRST),
    and launched with PDL when it is on for like's device."""
    on = enabled and like.is_cuda and _supported(like.device.index)
    mode = (RELEASE_FIRST if release_first else 1) if on else 0
    kernel[grid](*args, PDL=mode, **kwargs, **({"launch_pdl": True} if on else {}))


@triton.jit
def begin(PDL: tl.constexpr):
    """First statement of a PDL kernel: wait for the previous kernel, then release the next — with
    PDL == RELEASE_FIRST (the default), release it first (see the module docstring)."""
    if PDL == _RELEASE_FIRST:
        gdc_launch_dependents()
        gdc_wait()
    elif PDL:
        gdc_wait()
        gdc_launch_dependents()
