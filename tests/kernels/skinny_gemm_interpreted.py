"""The skinny GEMM (rlt/kernels/skinny_gemm.py) on the CPU under Triton's interpreter, every config,
plain and with its SwiGLU, against a float32 torch reference: rows 2 to 32 (BLOCK_M 16 and 32, both
padded), N a multiple of no block, K whole and ragged tiles, K split or not. bf16 in and out. Prints
one line per case; exits non-zero on a mismatch.

    TRITON_INTERPRET=1 python tests/kernels/skinny_gemm_interpreted.py [CONFIG INDEX ...]
"""

import os
import sys

import numpy as np
import torch
import triton.language as tl
import triton.runtime.interpreter as interpreter

# Triton 3.6's interpreter turns a loaded scalar into int() of a 1-element array, which NumPy 2
# refuses: index it instead (as tests/kernels/interpreted_kernels.py does; the compiled kernels
# never run this).
_patch = interpreter._patch_lang_tensor


def _patch_index(tensor, scope):
    _patch(tensor, scope)
    scope.set_attr(
        tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0])
    )


interpreter._patch_lang_tensor = _patch_index

# Triton 3.9's interpreter multiplies bf16 dot operands as their raw uint16 bits: widen them to
# float32 first (exact; the GPU's bf16 MMA also accumulates the exact products in float32).
_dot = interpreter.InterpreterBuilder.create_dot


def _dot_bf16(self, a, b, d, *args):
    a, b = (self.cast_impl(t, tl.float32) if t.dtype.scalar == tl.bfloat16 else t for t in (a, b))
    return _dot(self, a, b, d, *args)


interpreter.InterpreterBuilder.create_dot = _dot_bf16

ROWS = (2, 3, 8, 17, 32)
SHAPES = ((96, 256), (40, 200), (72, 1056))  # (N out, K): N ragged; K 1 to 9 tiles, ragged or not
# Of the reference's largest magnitude. The interpreter rounds float32 to bf16 toward zero (the GPU:
# to nearest), up to 2^-7 of a value: once for a product, four times for the SwiGLU (gate, silu,
# up, their product, each rounded as gemv_swiglu and the separate launches round).
TOLERANCE = {False: 1e-2, True: 4e-2}  # by SwiGLU


def check(config, swiglu: bool, M: int, N: int, K: int, g: torch.Generator) -> float:
    from rlt.kernels import skinny_gemm as sg

    x = torch.randn(M, K, generator=g).bfloat16()
    w = (torch.randn(2 * N if swiglu else N, K, generator=g) / K**0.5).bfloat16()
    ref = x.float() @ w.float().T
    if swiglu:
        gate, up = ref.chunk(2, dim=-1)
        ref = torch.nn.functional.silu(gate) * up
    got = (sg.skinny_gemm_swiglu if swiglu else sg.skinny_gemm)(x, w, config)
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape, (got.dtype, got.shape)
    return ((got.float() - ref).abs().max() / ref.abs().max()).item()


def main(argv: list[str]) -> int:
    """argv: indices into skinny_gemm.CONFIGS to check (default: all)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("run with TRITON_INTERPRET=1 (Triton's interpreter, on the CPU)")
        return 2
    from rlt.kernels import skinny_gemm as sg

    counters, scratch = {}, sg._scratch  # the split launches' arrival counters (by buffer)

    def recorded(*args):
        part, count = scratch(*args)
        counters[id(count)] = count
        return part, count

    sg._scratch = recorded
    g = torch.Generator().manual_seed(0)
    ok, worst, split = True, 0.0, 0
    for config in [sg.CONFIGS[int(i)] for i in argv] or sg.CONFIGS:
        for swiglu in (False, True):
            for N, K in SHAPES:
                for M in ROWS:
                    err = check(config, swiglu, M, N, K, g)
                    _, splits, _ = sg.plan(M, N, K, config, torch.device("cpu"))
                    bad = not err <= TOLERANCE[swiglu]
                    name = "skinny_gemm_swiglu" if swiglu else "skinny_gemm"
                    print(
                        f"{name} {config} M={M} N={N} K={K} splits={splits}: max error {err:.2e}{' FAIL' * bad}"
                    )
                    ok &= not bad
                    split += splits > 1
                    worst = max(worst, err / TOLERANCE[swiglu])
    # the arrival counters must be zero again after every split launch
    left = sum(int(count.abs().sum()) for count in counters.values())
    print(f"{split} cases split K; {len(counters)} arrival counter buffers, left nonzero: {left}")
    print(
        f"worst error {worst:.2f} of its tolerance: {'ok' if ok and left == 0 and split else 'FAILED'}"
    )
    return 0 if ok and left == 0 and split else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
