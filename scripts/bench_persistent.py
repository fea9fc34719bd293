"""Is a persistent kernel worth it for one-row decode? A chain of one-row products at a loop step's
shapes (Ouro-1.4B: per layer q/k/v, o, [gate; up], down; 24 layers), each product's input the
previous one's output, timed in CUDA graphs:

- launched: one GEMV launch per product (rlt/kernels/gemv.py, PDL on as in the engine), plain, with
  the SwiGLU epilogue on [gate; up] and no norms, or as the engine runs them: the residual add +
  RMSNorm after o and down a launch of its own (rlt/kernels/norm.py);
- the engine's launches with more K tiles read before each product's PDL wait (--early-tiles:
  q/k/v, o, [gate; up], down; rlt/kernels/gemv.py's NORMED_EARLY_TILES is the engine's o and down);
- launched with the add + RMSNorm as the next product's prologue instead: every program of the
  next product recomputes them from the previous output and the residual;
- persistent: one launch whose programs (as many as fit on the GPU at once) take each product's
  row blocks in turn and meet at a grid barrier (an arrival counter) between products;
- prefetch: the same, each program reading its first weight tile of the next product before it
  waits at the barrier (weights never depend on the chain);
- each with the barrier's waiting programs spinning on atomics on its counter, or on plain loads
  of it (one acquire after); programs per SM only as many as fit at once (else the barrier hangs).

Prints microseconds per chain, per product boundary, and the share of the chain's bytes over the
measured copy rate (the roofline), so the choice for #36's loop-step kernel rests on numbers.

    python scripts/bench_persistent.py [--layers 24] [--rows-per-program 2] [--programs-per-sm 4]
        [--early-tiles 1,1,1,1 1,3,1,3]
"""

import argparse
import itertools

import torch
import triton
import triton.language as tl

from rlt.bench import floors
from rlt.kernels import gemv, norm, pdl
from rlt.kernels.norm import norm_row


@triton.jit
def _grid_barrier(count_ptr, target, SPIN_LOAD: tl.constexpr):
    """Every program's stores before it are visible to every program after it: arrive (release),
    then wait until target programs have arrived (acquire). SPIN_LOAD: wait on plain (volatile)
    loads of the counter and acquire once, where every waiting program otherwise issues atomics on
    the one counter."""
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="release")
    if SPIN_LOAD:
        while tl.load(count_ptr, volatile=True) < target:
            pass
        tl.atomic_add(count_ptr, 0, sem="acquire")
        tl.debug_barrier()
    else:
        while tl.atomic_add(count_ptr, 0, sem="acquire") < target:
            pass


@triton.jit
def _chain_kernel(
    buf_ptr,
    w_table,
    n_table,
    k_table,
    count_ptr,
    STAGES,
    STRIDE_BUF,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREFETCH: tl.constexpr,
    SPIN_LOAD: tl.constexpr,
):
    """Stage s: buf[s + 1][:N_s] = W_s @ buf[s][:K_s], row blocks of BLOCK_N shared out over the
    programs; a grid barrier between stages."""
    pid, P = tl.program_id(0), tl.num_programs(0)
    offs_n, offs_k = tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_K)
    pre = tl.zeros((BLOCK_N, BLOCK_K), tl.bfloat16)
    if PREFETCH:  # stage 0's first tile
        N0, K0 = tl.load(n_table), tl.load(k_table)
        w0 = tl.load(w_table).to(tl.pointer_type(tl.bfloat16))
        rows = pid * BLOCK_N + offs_n
        pre = tl.load(w0 + rows[:, None] * K0 + offs_k[None, :], mask=(rows < N0)[:, None] & (offs_k < K0)[None, :])
    for s in range(STAGES):
        N, K = tl.load(n_table + s), tl.load(k_table + s)
        w_ptr = tl.load(w_table + s).to(tl.pointer_type(tl.bfloat16))
        x_ptr, y_ptr = buf_ptr + s * STRIDE_BUF, buf_ptr + (s + 1) * STRIDE_BUF
        for item in range(pid, tl.cdiv(N, BLOCK_N), P):
            rows = item * BLOCK_N + offs_n
            row_ok = rows < N
            acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + offs_k
                first = PREFETCH and (item == pid) & (k0 == 0)  # (the tile read before the barrier)
                w = tl.load(w_ptr + rows[:, None] * K + kk[None, :], mask=row_ok[:, None] & (kk < K)[None, :] & ~first)
                if PREFETCH:
                    w = tl.where(first, pre, w)
                x = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
                acc += w.to(tl.float32) * x[None, :]
            tl.store(y_ptr + rows, tl.sum(acc, axis=1).to(tl.bfloat16), mask=row_ok)
        if PREFETCH and s + 1 < STAGES:  # the next stage's first tile, before waiting
            N1, K1 = tl.load(n_table + s + 1), tl.load(k_table + s + 1)
            w1 = tl.load(w_table + s + 1).to(tl.pointer_type(tl.bfloat16))
            rows = pid * BLOCK_N + offs_n
            pre = tl.load(w1 + rows[:, None] * K1 + offs_k[None, :], mask=(rows < N1)[:, None] & (offs_k < K1)[None, :])
        _grid_barrier(count_ptr, (s + 1) * P, SPIN_LOAD)


@triton.jit
def _prologue_gemv_kernel(
    a_ptr,
    r_ptr,
    wa_ptr,
    wo_ptr,
    ro_ptr,
    w_ptr,
    y_ptr,
    N,
    K,
    eps,
    BLOCK_N: tl.constexpr,
    ROW: tl.constexpr,
    SWIGLU: tl.constexpr,
    PDL: tl.constexpr,
):
    """y = W @ h with h = rms_norm(r + rms_norm(a, wa), wo) computed by every program from the previous
    product's output a and the residual r (program 0 also stores r + rms_norm(a, wa) to ro): the
    add + RMSNorm tail as the next product's prologue, with no arrival counter. SWIGLU: W is [gate;
    up] (2N rows) and y = silu(gate @ h) * (up @ h). Its whole weight tile is read before the wait."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs = tl.arange(0, ROW)
    ok, k_ok = rows < N, offs < K
    mask = ok[:, None] & k_ok[None, :]
    w = tl.load(w_ptr + rows[:, None] * K + offs[None, :], mask=mask, other=0.0)
    w_up = w
    if SWIGLU:
        w_up = tl.load(w_ptr + (rows + N)[:, None] * K + offs[None, :], mask=mask, other=0.0)
    wa = tl.load(wa_ptr + offs, mask=k_ok, other=0.0)
    wo = tl.load(wo_ptr + offs, mask=k_ok, other=0.0)
    pdl.begin(PDL)
    dt = y_ptr.dtype.element_ty
    a = tl.load(a_ptr + offs, mask=k_ok, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=k_ok, other=0.0).to(tl.float32)
    r = (r + norm_row(a, wa, K, eps, dt).to(tl.float32)).to(dt)
    if tl.program_id(0) == 0:
        tl.store(ro_ptr + offs, r, mask=k_ok)
    h = norm_row(r.to(tl.float32), wo, K, eps, dt).to(tl.float32)
    y = tl.sum(w.to(tl.float32) * h[None, :], axis=1).to(dt)
    if SWIGLU:
        g = y.to(tl.float32)
        up = tl.sum(w_up.to(tl.float32) * h[None, :], axis=1).to(dt)
        y = ((g * tl.sigmoid(g)).to(dt).to(tl.float32) * up.to(tl.float32)).to(dt)
    tl.store(y_ptr + rows, y, mask=ok)


def prologue_gemv(a, r, wa, wo, eps, w, swiglu: bool, rows: int, warps: int):
    """-> (y, r + rms_norm(a, wa)): _prologue_gemv_kernel's outputs."""
    N, K = w.shape[0] // (2 if swiglu else 1), w.shape[1]
    y, ro = torch.empty(1, N, device=a.device, dtype=a.dtype), torch.empty_like(r)
    pdl.launch(
        _prologue_gemv_kernel,
        (triton.cdiv(N, rows),),
        a,
        r,
        wa,
        wo,
        ro,
        w,
        y,
        N,
        K,
        eps,
        BLOCK_N=rows,
        ROW=triton.next_power_of_2(K),
        SWIGLU=swiglu,
        num_warps=warps,
        like=a,
    )
    return y, ro


def resident_per_sm(kernel, warps: int) -> int:
    """Programs of this compiled kernel an SM holds at once (registers, shared memory, warps; an
    H100/H200's limits where torch does not say them). 4 (run before) when Triton does not say."""
    n_regs, shared = getattr(kernel, "n_regs", None), getattr(getattr(kernel, "metadata", None), "shared", None)
    if n_regs is None or shared is None:
        return 4
    props = torch.cuda.get_device_properties(0)
    regs = -(-n_regs * 32 // 256) * 256 * warps  # (allocated per warp in units of 256)
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // max(regs, 1)
    by_smem = getattr(props, "shared_memory_per_multiprocessor", 233472) // max(shared, 1)
    by_warps = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps)
    return min(by_regs, by_smem, by_warps, 32)


def shapes(hidden=2048, inter=5632, qkv=6144, layers=24):
    """(N, K) of each product of a loop step, in order."""
    return [(qkv, hidden), (hidden, qkv // 3), (2 * inter, hidden), (hidden, inter)] * layers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--rows-per-program", type=int, default=2)
    ap.add_argument("--block-k", type=int, default=1024)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--programs-per-sm", type=str, default="2,4,8,16", help="(those that fit on an SM at once)")
    early = ["1,1,1,1", "1,2,1,1", "1,2,1,2", "1,3,1,3", "2,2,1,2", "1,2,2,2"]
    ap.add_argument("--early-tiles", nargs="*", default=early, help="K tiles before the wait: q/k/v,o,gate_up,down")
    args = ap.parse_args()
    torch.manual_seed(0)
    dims = shapes(layers=args.layers)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for n, k in dims]
    width = max(max(n, k) for n, k in dims)
    buf = torch.zeros(len(dims) + 1, width, device="cuda", dtype=torch.bfloat16)
    buf[0].normal_()
    nbytes = sum(w.numel() * 2 for w in ws)
    rate = floors.ceilings("cuda")["copy_gbps"] * 1e9  # (as rlt bench offline measures it)
    floor_us = nbytes / rate * 1e6

    cfg = gemv.GemvConfig(args.rows_per_program, args.block_k, args.warps)

    def launched():
        for s, (w, (n, k)) in enumerate(zip(ws, dims)):
            buf[s + 1, :n] = gemv.gemv(buf[s : s + 1, :k], w, cfg)[0]

    def launched_out():  # (the copy into buf is a launch of its own: time the products alone too)
        x = buf[0:1, : dims[0][1]]
        for w, (n, k) in zip(ws, dims):
            x = gemv.gemv(x[:, :k], w, cfg)

    hidden = dims[1][0]
    r = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
    wa, wo = (1 + 0.1 * torch.randn(hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def launched_engine(early=(1, gemv.NORMED_EARLY_TILES, 1, gemv.NORMED_EARLY_TILES)):
        x, res = buf[0:1, :hidden], r  # a layer's products as the engine runs them (attention left out)
        for qkv, o, gate_up, down in zip(*[iter(ws)] * 4):
            q = gemv.gemv(x, qkv, cfg, early[0])[:, : o.shape[1]]
            res, x = norm.add_rms_norm(res, gemv.gemv(q, o, cfg, early[1]), wa, wo, 1e-6)
            g = gemv.gemv_swiglu(x, gate_up, cfg, early[2])
            res, x = norm.add_rms_norm(res, gemv.gemv(g, down, cfg, early[3]), wa, wo, 1e-6)
        return x

    def launched_swiglu():  # the SwiGLU epilogue alone (no norms): its price apart from the tails'
        x = buf[0:1, :hidden]
        for qkv, o, gate_up, down in zip(*[iter(ws)] * 4):
            q = gemv.gemv(x, qkv, cfg)[:, : o.shape[1]]
            x = gemv.gemv_swiglu(gemv.gemv(q, o, cfg), gate_up, cfg)
            x = gemv.gemv(x, down, cfg)

    def launched_prologues():  # the same, each add + RMSNorm done by the next product's programs
        a, res = buf[0:1, :hidden], r  # (a: the previous down product's output)
        for qkv, o, gate_up, down in zip(*[iter(ws)] * 4):
            q, res = prologue_gemv(a, res, wa, wo, 1e-6, qkv, False, args.rows_per_program, args.warps)
            o_out = gemv.gemv(q[:, : o.shape[1]], o, cfg)
            g, res = prologue_gemv(o_out, res, wa, wo, 1e-6, gate_up, True, args.rows_per_program, args.warps)
            a = gemv.gemv(g, down, cfg)
        return a

    w_table = torch.tensor([w.data_ptr() for w in ws], device="cuda", dtype=torch.int64)
    n_table = torch.tensor([n for n, _ in dims], device="cuda", dtype=torch.int32)
    k_table = torch.tensor([k for _, k in dims], device="cuda", dtype=torch.int32)
    count = torch.zeros(1, device="cuda", dtype=torch.int32)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = [
        ("launched (PDL)", floors.graph_us(launched_out)),
        ("launched, SwiGLU epilogue, no norms", floors.graph_us(launched_swiglu)),
        ("launched as the engine runs them (+ add + RMSNorm launches)", floors.graph_us(launched_engine)),
        ("launched, add + RMSNorm as the next's prologue", floors.graph_us(launched_prologues)),
    ]
    ref_engine = launched_engine((1, 1, 1, 1)).float()
    for early in (tuple(map(int, e.split(","))) for e in args.early_tiles):
        err = (launched_engine(early).float() - ref_engine).abs().max().item()
        t = floors.graph_us(lambda e=early: launched_engine(e))
        rows.append((f"as the engine, K tiles before the wait {early} (diff {err:.0e})", t))
    launched()  # (the persistent launches are checked against its output)
    ref = buf[-1, : dims[-1][0]].float().clone()

    def chain(programs: int, prefetch: bool, spin_load: bool):
        count.zero_()
        return _chain_kernel[(programs,)](
            buf,
            w_table,
            n_table,
            k_table,
            count,
            len(dims),
            buf.stride(0),
            BLOCK_N=args.rows_per_program,
            BLOCK_K=args.block_k,
            PREFETCH=prefetch,
            SPIN_LOAD=spin_load,
            num_warps=args.warps,
        )

    for prefetch, spin_load in itertools.product((False, True), (False, True)):
        # A grid barrier hangs unless every program is resident at once: one program first (it
        # compiles the variant), then only as many per SM as its registers and shared memory allow.
        fit = resident_per_sm(chain(1, prefetch, spin_load), args.warps)
        for per_sm in (int(p) for p in args.programs_per_sm.split(",")):
            name = (
                f"persistent {per_sm}/SM{' +prefetch' if prefetch else ''}{', load-spin barrier' if spin_load else ''}"
            )
            if per_sm > fit:
                print(f"{name}: skipped, {fit} fit on an SM")
                continue
            chain(sms * per_sm, prefetch, spin_load)
            torch.cuda.synchronize()
            err = (buf[-1, : dims[-1][0]].float() - ref).abs().max().item()
            t = floors.graph_us(lambda n=sms * per_sm, p=prefetch, sl=spin_load: chain(n, p, sl))
            rows.append((f"{name} (max diff {err:.1e})", t))
    print(f"{len(dims)} products, {nbytes / 1e9:.3f} GB, copy rate {rate / 1e12:.2f} TB/s, floor {floor_us:.1f} us")
    print(f"{'variant':<66} {'us/chain':>9} {'us/product':>10} {'of roof':>8}")
    for name, t in rows:
        print(f"{name:<66} {t:>9.1f} {t / len(dims):>10.2f} {floor_us / t:>8.3f}")


if __name__ == "__main__":
    main()
