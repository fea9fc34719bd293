"""`rlt bench gemm`: the few-row products of decode passes (1 to 32 rows, Ouro-1.4B's and
Nanbeige4.2-3B's projections) through cuBLAS (F.linear), the one-row GEMV (rlt/kernels/gemv.py),
the two-row GEMV's configs (rlt/kernels/gemv_rows.py) and the skinny GEMM's
(rlt/kernels/skinny_gemm.py). CUDA only.

Each variant is timed as the engine runs it: many calls in a CUDA graph (do_bench_cudagraph, its
median), each call on the next of a rotating set of weight copies (together several times the L2),
so every call reads its weights from HBM. The [gate; up] products' cuBLAS row is the engine's path
without the skinny GEMM: F.linear, then the SwiGLU launch (rlt/kernels/activation.py). Launches use
PDL as the engine does (RLT_PDL=0: off). GB/s counts the bytes a product must move (weights + x +
y) over its time; "read" is its share of the streaming read rate measured first
(rlt/bench/floors.py). Each result is checked against the float32 product; a mismatch is flagged
and never counts as best.
"""

import functools
import math
import sys

SHAPES = (  # (model, product, rows of w, K, SwiGLU epilogue)
    ("ouro", "qkv", 6144, 2048, False),
    ("ouro", "o", 2048, 2048, False),
    ("ouro", "gate_up", 11264, 2048, True),
    ("ouro", "down", 2048, 5632, False),
    ("nanbeige", "qkv", 8192, 3072, False),
    ("nanbeige", "o", 3072, 6144, False),
    ("nanbeige", "gate_up", 21504, 3072, True),
    ("nanbeige", "down", 3072, 10752, False),
)
ROWS = (1, 2, 4, 8, 16, 32)
QUICK = (0, 1, 3, 7)  # indices into skinny_gemm.CONFIGS timed with --quick
TOLERANCE = {False: 1e-2, True: 2e-2}  # max error over the reference's max magnitude, by SwiGLU


def add_arguments(p) -> None:
    p.add_argument(
        "--quick", action="store_true", help=f"time only skinny_gemm.CONFIGS{list(QUICK)}"
    )
    p.add_argument(
        "--shapes",
        nargs="*",
        help="model[:product] filters, e.g. ouro nanbeige:down (default: all)",
    )
    p.add_argument(
        "--rows",
        nargs="*",
        type=int,
        default=list(ROWS),
        help="row counts M (default: %(default)s)",
    )
    p.add_argument("--l2-mb", type=float, default=50.0, help="L2 size in MB (default: %(default)s)")
    p.add_argument(
        "--rotate", type=float, default=4.0, help="weight copies total this many L2s (default: 4)"
    )
    p.add_argument(
        "--rep", type=int, default=20, help="ms of calls per CUDA graph (default: %(default)s)"
    )


def command(args) -> None:
    import torch
    import torch.nn.functional as F
    import triton

    if not torch.cuda.is_available():
        sys.exit("rlt bench gemm needs a CUDA device")
    from rlt.bench.floors import read_gbps
    from rlt.kernels import gemv, pdl
    from rlt.kernels import gemv_rows as gr
    from rlt.kernels import skinny_gemm as sg
    from rlt.kernels.activation import silu_mul

    dev = torch.device("cuda")
    configs = [sg.CONFIGS[i] for i in QUICK] if args.quick else list(sg.CONFIGS)
    shapes = [s for s in SHAPES if not args.shapes or any(_matches(f, s) for f in args.shapes)]
    src = torch.empty(1 << 30, dtype=torch.int16, device=dev)
    read = read_gbps(src)
    del src
    print(
        f"{torch.cuda.get_device_name(dev)}: streaming read {read:.0f} GB/s; PDL {'on' if pdl.enabled() else 'off'}"
    )
    summary = []
    for model, name, rows_w, K, swiglu in shapes:
        N = rows_w // 2 if swiglu else rows_w
        w_bytes = rows_w * K * 2
        copies = max(2, math.ceil(args.rotate * args.l2_mb * 1e6 / w_bytes))
        ws = [
            torch.randn(rows_w, K, device=dev, dtype=torch.bfloat16) * K**-0.5
            for _ in range(copies)
        ]
        print(
            f"\n== {model} {name}: w [{rows_w}, {K}]{' + SwiGLU' if swiglu else ''}, {copies} copies rotating"
        )
        for M in args.rows:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            ref = x.float() @ ws[0].float().T
            if swiglu:
                ref = F.silu(ref[:, :N]) * ref[:, N:]
            moved = w_bytes + M * K * 2 + M * N * 2
            variants = {"cublas": (lambda x, w: silu_mul(F.linear(x, w))) if swiglu else F.linear}
            if swiglu:
                variants["cublas linear only"] = F.linear  # (its y is [M, 2N]: no SwiGLU)
            if M == 1:
                variants["gemv"] = gemv.gemv_swiglu if swiglu else gemv.gemv
            if M == 2:
                for c in gr.SWEEP:
                    variants[f"gemv rows {c}"] = _bound(
                        gr.gemv_rows_swiglu if swiglu else gr.gemv_rows, c
                    )
            for c in configs:
                variants[f"skinny {c}"] = _bound(
                    sg.skinny_gemm_swiglu if swiglu else sg.skinny_gemm, c
                )
            results = {}
            for label, op in variants.items():
                try:
                    y = op(x, ws[0])  # (compiles, allocates split scratch: before any capture)
                    err = float("nan") if y.shape != ref.shape else _rel(y, ref)
                    us = _time_us(op, x, ws, args.rep, triton)
                except Exception as e:  # a config that does not fit (shared memory, registers)
                    print(
                        f"  M={M:2d} {label:34s} failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
                    )
                    continue
                bad = not err <= TOLERANCE[swiglu] and label != "cublas linear only"
                results[label] = (us, bad)
                gbps = moved / us / 1e3
                flag = "  MISMATCH" if bad else ""
                print(
                    f"  M={M:2d} {label:34s} {us:8.2f} us {gbps:7.0f} GB/s  read {gbps / read:5.1%}",
                    end="",
                )
                print(f"  err {err:.1e}{flag}")
            skinny = {
                k: us for k, (us, bad) in results.items() if k.startswith("skinny") and not bad
            }
            best = min(skinny, key=skinny.get) if skinny else None
            good = {k: us for k, (us, bad) in results.items() if not bad}
            gemvs = [us for k, us in good.items() if k.startswith("gemv")]
            row = (f"{model}:{name}", M, moved, good.get("cublas"), min(gemvs, default=None))
            summary.append(
                row + ((best.removeprefix("skinny "), skinny[best]) if best else (None, None))
            )
        del ws
        torch.cuda.empty_cache()
    _table(summary, read)


def _matches(pattern: str, shape) -> bool:
    model, _, product = pattern.partition(":")
    return model in shape[0] and (not product or product == shape[1])


def _bound(fn, config):
    return lambda x, w: fn(x, w, config)


def _rel(y, ref) -> float:
    return ((y.float() - ref).abs().max() / ref.abs().max()).item()


def _time_us(op, x, ws, rep: int, triton) -> float:
    """µs per call: one call per weight copy in turn, captured in a CUDA graph and replayed."""

    def run():
        for w in ws:
            op(x, w)

    return triton.testing.do_bench_cudagraph(run, rep=rep, return_mode="median") * 1e3 / len(ws)


def _frac(moved: int, read: float, us: float | None) -> str:
    return f"{moved / us / 1e3 / read:5.0%}" if us else f"{'-':>5s}"


def _table(summary, read: float) -> None:
    print(
        f"\nspeedup = cuBLAS us / best skinny us; read = GB/s (weights + x + y) over {read:.0f} GB/s;"
    )
    print("cuBLAS on [gate; up]: F.linear + the SwiGLU launch (the engine's path at M >= 2)")
    print(
        f"{'shape':16s} {'M':>2s} {'cuBLAS us':>9s} {'read':>5s}  {'best skinny':22s} {'us':>7s} {'speedup':>7s}"
        f" {'read':>5s} {'best gemv us':>7s}"
    )
    nan = float("nan")
    for shape, M, moved, cublas, gv, best, sk in summary:
        frac = functools.partial(_frac, moved, read)
        speed = cublas / sk if cublas and sk else nan
        line = f"{shape:16s} {M:2d} {cublas or nan:9.2f} {frac(cublas)}  {best or '-':22s} {sk or nan:7.2f}"
        print(f"{line} {speed:7.2f} {frac(sk)} {f'{gv:7.2f}' if gv else ''}".rstrip())
