"""Registers, resident programs per SM and weight bytes in flight per SM of each one-row GEMV
config on an H100/H200 (sm_90a), from ptxas on the CPU: which configs can keep enough loads in
flight to stream weights at full bandwidth, before spending GPU time on them.

    python scripts/gemv_occupancy.py [--configs 2,1024,4 2,2048,4] [--shapes 6144x2048 2048x2048 ...]

Bytes in flight per SM is an upper bound: every resident program with its weight tile loading;
a grid smaller than one wave leaves SMs with fewer programs.
Needs only triton (its bundled ptxas).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from rlt.kernels import gemv  # noqa: E402

SMS, REGS_PER_SM, WARPS_PER_SM, CTAS_PER_SM, SMEM_PER_SM = 132, 65536, 64, 32, 233472  # H100 / H200 SXM
SIGNATURE = dict(x_ptr="*bf16", w_ptr="*bf16", y_ptr="*bf16", N="i32", K="i32", stride_wn="i32", r_ptr="*bf16",
                 wa_ptr="*bf16", wo_ptr="*bf16", ro_ptr="*bf16", h_ptr="*bf16", count_ptr="*i32", gw_ptr="*fp32",
                 gb_ptr="*fp32", gate_ptr="*fp32", eps="fp32")


def jit_attrs(signature: dict[str, str]) -> dict:
    """Compile attributes as the JIT specializes a launch: 16-byte aligned pointers, sizes and strides
    that are multiples of 16 (Ouro's are) — what lets loads vectorize (and cp.async pipeline), and
    so what register counts depend on."""
    return {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(signature.items())
            if kind.startswith("*") or name in ("N", "K") or name.startswith("stride")}


def registers(config: gemv.GemvConfig, epilogue: int, row: int, k_tiles: int = 0) -> tuple[int, int]:
    """(registers per thread from ptxas, shared memory bytes per program); k_tiles > 0: the K loop
    unrolled over that many tiles (gemv.unrolled_tiles)."""
    consts = dict(BLOCK_N=config.rows, BLOCK_K=config.k, EPILOGUE=epilogue, NORM_A=True, GATE=False, ROW=row,
                  K_TILES=k_tiles, PDL=True)
    src = ASTSource(fn=gemv._gemv_kernel, signature={**SIGNATURE, **{k: "constexpr" for k in consts}},
                    constexprs=consts, attrs=jit_attrs(SIGNATURE))
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"launch_pdl": True,
                                                                             "num_warps": config.warps})
    ptx = kernel.asm["ptx"]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        out = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull], capture_output=True,
                             text=True).stderr
    return int(re.search(r"Used (\d+) registers", out)[1]), kernel.metadata.shared


def resident(regs: int, warps: int, smem: int = 0) -> int:
    per_warp = -(-regs * 32 // 256) * 256  # allocated per warp in units of 256 registers
    by_smem = SMEM_PER_SM // (smem + 1024) if smem else CTAS_PER_SM  # (1 KB reserved per program)
    return min(REGS_PER_SM // (per_warp * warps), WARPS_PER_SM // warps, CTAS_PER_SM, by_smem)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="*", help="rows,k,warps (default: gemv.CONFIGS)")
    # Ouro-1.4B's one-row GEMMs: [q; k; v] (plain), o (add + norm), [gate; up] (SwiGLU), down (add + norm)
    ap.add_argument("--shapes", nargs="*", default=["6144x2048:plain", "2048x2048:add_norm", "11264x2048:swiglu",
                                                    "2048x5632:add_norm"])
    args = ap.parse_args()
    configs = ([gemv.GemvConfig(*map(int, c.split(","))) for c in args.configs] if args.configs else gemv.CONFIGS)
    epilogues = {"plain": gemv.PLAIN, "swiglu": gemv.SWIGLU, "add_norm": gemv.ADD_NORM}
    for config in configs:
        cells = []
        for spec in args.shapes:
            shape, name = spec.split(":")
            N, K = map(int, shape.split("x"))
            rows = N // 2 if name == "swiglu" else N
            regs, smem = registers(config, epilogues[name], triton.next_power_of_2(rows) if name == "add_norm" else 1,
                                   gemv.unrolled_tiles(K, config, epilogues[name]))
            per_sm = resident(regs, config.warps, smem)
            programs = triton.cdiv(rows, config.rows)
            active = min(per_sm, programs / SMS)  # programs per SM while the first wave runs
            tile = config.rows * config.k * 2 * (2 if name == "swiglu" else 1)  # one weight tile per program
            cells.append(f"{shape} {name}: {regs} regs, {smem // 1024} KB smem, {per_sm}/SM, "
                         f"{programs / (per_sm * SMS):.2f} waves, {active * tile / 1024:.0f} KB")
        print(f"{str(config):<22}" + " | ".join(cells))


if __name__ == "__main__":
    main()
