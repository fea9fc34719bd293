"""The kernel set of this worker process: set by LoopEngine (rlt/workers/engine.py) from
EngineConfig.kernels and EngineConfig.batch_invariant when the worker builds its engine."""

import torch

triton = False  # CUDA: the Triton kernels (and CUDA graphs); False: the torch reference everywhere
batch_invariant = False  # CUDA: kernels whose per-row results never depend on the batch


def configure(device: str, kernels: str, invariant: bool) -> None:
    """kernels: "triton" (on CUDA; the CPU always runs the torch reference) or "reference"."""
    global triton, batch_invariant
    triton = torch.device(device).type == "cuda" and kernels == "triton"
    batch_invariant = invariant and triton


def use_triton(x: torch.Tensor) -> bool:
    return triton and x.is_cuda
