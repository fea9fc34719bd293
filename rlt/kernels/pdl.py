"""Programmatic dependent launch (PDL, Hopper and later) for the kernels of a decode pass.

A kernel launched with PDL may be scheduled while the kernel before it on the stream finishes. A
one-row decode pass is a few hundred short launches; PDL overlaps their launch latency,
scheduling and reads of constant data (the GEMV's first weight tile) with the previous kernel's
tail. Results are unchanged. On by default on Hopper and later (rlt.envs.pdl_enabled: RLT_PDL=0
turns it off); never on the CPU or under Triton's interpreter.

Each kernel first lets its successor launch (griddepcontrol.launch_dependents), then waits for
the previous kernel (griddepcontrol.wait: all its writes visible) before touching anything another
kernel writes. Releasing before the wait lets the successor issue its early reads (weights, older
keys) while the kernel before this one still runs. Safe because no kernel reads, before its wait,
anything a kernel of the pass writes (tests/kernels/test_kernels_compiled.py checks each kernel's
early reads), and the successor's own wait still waits for this kernel to complete.
"""

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from rlt import envs


@functools.cache
def _supported(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


@functools.cache
def enabled() -> bool:
    """PDL unless RLT_PDL=0 (read once per process)."""
    return envs.pdl_enabled()


def launch(kernel, grid, *args, like: torch.Tensor, **kwargs) -> None:
    """kernel[grid](*args, **kwargs) with its PDL constexpr set, launched with PDL when it is on for
    like's device."""
    on = like.is_cuda and enabled() and _supported(like.device.index)
    kernel[grid](*args, PDL=on, **kwargs, **({"launch_pdl": True} if on else {}))


@triton.jit
def begin(PDL: tl.constexpr):
    """First statement of a PDL kernel (after its early reads): release the next kernel, then wait
    for the previous one."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
