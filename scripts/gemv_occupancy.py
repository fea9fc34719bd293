"""Registers, resident programs per SM and weight bytes in flight per SM of each one-row GEMV
config on an H100/H200 (sm_90a), from ptxas on the CPU: which configs can keep enough loads in
flight to stream weights at full bandwidth, before spending GPU time on them.

    python scripts/gemv_occupancy.py [--configs 2,1024,4 2,2048,4] [--shapes 6144x2048 2048x2048 ...]

Bytes in flight per SM is an upper bound: every resident program with its weight tile loading;
a grid smaller than one wave leaves SMs with fewer programs.
Needs only triton (its bundled ptxas); the logic is rlt/kernels/occupancy.py.
"""

import argparse

import triton

from rlt.kernels import gemv
from rlt.kernels.occupancy import SMS, gemv_registers, resident


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="*", help="rows,k,warps (default: gemv.CONFIGS)")
    # Ouro-1.4B's one-row GEMMs: [q; k; v], o, [gate; up] (SwiGLU), down
    ap.add_argument(
        "--shapes",
        nargs="*",
        default=["6144x2048:plain", "2048x2048:plain", "11264x2048:swiglu", "2048x5632:plain"],
    )
    args = ap.parse_args()
    configs = [gemv.GemvConfig(*map(int, c.split(","))) for c in args.configs] if args.configs else gemv.CONFIGS
    epilogues = {"plain": gemv.PLAIN, "swiglu": gemv.SWIGLU}
    for config in configs:
        cells = []
        for spec in args.shapes:
            shape, name = spec.split(":")
            N, _ = map(int, shape.split("x"))
            rows = N // 2 if name == "swiglu" else N
            regs, smem = gemv_registers(config, epilogues[name])
            per_sm = resident(regs, config.warps, smem)
            programs = triton.cdiv(rows, config.rows)
            active = min(per_sm, programs / SMS)  # programs per SM while the first wave runs
            tile = config.rows * config.k * 2 * (2 if name == "swiglu" else 1)  # one weight tile per program
            cells.append(
                f"{shape} {name}: {regs} regs, {smem // 1024} KB smem, {per_sm}/SM, "
                f"{programs / (per_sm * SMS):.2f} waves, {active * tile / 1024:.0f} KB"
            )
        print(f"{str(config):<22}" + " | ".join(cells))


if __name__ == "__main__":
    main()
