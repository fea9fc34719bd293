"""Kernels compiled for Hopper (sm_90a) on the CPU, and what ptxas makes of them: registers per
thread and programs resident per SM on an H100 / H200. No GPU needed, only triton (its compiler
and bundled CUDA tools). Used by tests/kernels/test_kernels_compiled.py; the engine never imports
it.
"""

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from rlt.kernels import gemv

# H100 / H200 SXM
SMS, REGS_PER_SM, WARPS_PER_SM, CTAS_PER_SM, SMEM_PER_SM = 132, 65536, 64, 32, 233472
GEMV_SIGNATURE = dict(
    x_ptr="*bf16",
    w_ptr="*bf16",
    y_ptr="*bf16",
    N="i32",
    K="i32",
    stride_wn="i32",
)


def tool(name: str) -> str:
    """The path of a CUDA tool bundled with triton: ptxas, cuobjdump."""
    try:
        return getattr(triton.knobs.nvidia, name).path
    except AttributeError:
        return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def jit_attrs(signature: dict[str, str]) -> dict:
    """Compile attributes as the JIT specializes a launch: 16-byte aligned pointers, sizes and strides
    that are multiples of 16 (the models' are) — what lets loads vectorize, and so what register
    counts depend on."""
    return {
        (i,): [["tt.divisibility", 16]]
        for i, (name, kind) in enumerate(signature.items())
        if kind.startswith("*") or name in ("N", "K") or name.startswith("stride")
    }


def compile_sm90(fn, signature: dict[str, str], constexprs: dict, aligned: bool = False, **options):
    """fn compiled for sm_90 with these argument types and constants (PDL among them: launch_pdl
    follows it); aligned: with the JIT's alignment attributes."""
    src = ASTSource(
        fn=fn,
        signature={**signature, **{k: "constexpr" for k in constexprs}},
        constexprs=constexprs,
        attrs=jit_attrs(signature) if aligned else None,
    )
    options = {"launch_pdl": bool(constexprs.get("PDL")), **options}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def registers(cubin: bytes) -> int:
    """Registers per thread of a compiled kernel (kernel.asm["cubin"]: what ptxas made of it)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(
            [tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    return int(re.search(r"REG:(\d+)", out)[1])


def gemv_registers(config: gemv.GemvConfig, epilogue: int, early_tiles: int = 1) -> tuple[int, int]:
    """(registers per thread, shared memory bytes per program) of one GEMV variant with PDL."""
    consts = dict(
        BLOCK_N=config.rows, BLOCK_K=config.k, EPILOGUE=epilogue, EARLY=early_tiles, PDL=True
    )
    kernel = compile_sm90(
        gemv._gemv_kernel, GEMV_SIGNATURE, consts, aligned=True, num_warps=config.warps
    )
    return registers(kernel.asm["cubin"]), kernel.metadata.shared


def resident(regs: int, warps: int, smem: int = 0) -> int:
    """Programs resident per SM: registers are allocated per warp in units of 256, at most 64 warps
    and 32 programs per SM, and shared memory (1 KB reserved per program)."""
    per_warp = -(-regs * 32 // 256) * 256
    by_smem = SMEM_PER_SM // (smem + 1024) if smem else CTAS_PER_SM
    return min(REGS_PER_SM // (per_warp * warps), WARPS_PER_SM // warps, CTAS_PER_SM, by_smem)
