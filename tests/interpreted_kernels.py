"""Runs Triton kernels on the CPU under Triton's interpreter (TRITON_INTERPRET=1, set by
test_kernels_interpreted.py before triton is imported) against the torch references, so CI checks
kernel logic without a GPU. Prints one line per check; exits non-zero on a mismatch."""

import sys

import numpy as np
import torch
import triton.runtime.interpreter as interpreter

from kernel_cases import decode_case

# Triton 3.6's interpreter turns a loaded scalar into int() of a 1-element array, which NumPy 2
# refuses: index it instead (test-only; the compiled kernels never run this code).
_patch = interpreter._patch_lang_tensor


def _patch_index(tensor, scope):
    _patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))


interpreter._patch_lang_tensor = _patch_index


def check_decode_attention() -> bool:
    from rlt.kernels.decode_attention import _counters, decode_attention
    from rlt.kernels.paged_attention import paged_attention

    ok = True
    for H, Hkv, D in ((2, 2, 16), (4, 2, 16), (3, 1, 8)):  # MHA (vector path), GQA (dot path, padded group)
        cache, meta, tab, q, pos = decode_case(H, Hkv, D, torch.float32, "cpu", layers=1)
        ref = paged_attention(cache, 0, meta, q, None, None)
        for splits in (1, 4):
            err = (decode_attention(cache, 0, q, tab, pos, meta.block_size, splits) - ref).abs().max().item()
            print(f"decode_attention H={H} Hkv={Hkv} D={D} splits={splits}: max error {err:.2e}")
            ok &= err <= 1e-5
    left = int(_counters(torch.device("cpu")).abs().sum())
    print(f"split arrival counters left nonzero: {left}")
    return ok and left == 0


def check_gemv() -> bool:
    from rlt.kernels.gemv import CONFIGS, gemv

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 300, generator=g), torch.randn(37, 300, generator=g)  # ragged N and K
    ref = x @ w.T
    ok = True
    for cfg in CONFIGS:
        err = (gemv(x, w, cfg) - ref).abs().max().item()
        print(f"gemv {cfg}: max error {err:.2e}")
        ok &= err <= 1e-4
    return ok


if __name__ == "__main__":
    sys.exit(0 if check_decode_attention() & check_gemv() else 1)
