"""The decode-pass kernels compile for Hopper (sm_90) on the CPU, and with programmatic dependent
launch (rlt/kernels/pdl.py) each one waits for the previous kernel before touching memory another
kernel writes: griddepcontrol.wait precedes every global store and atomic in the PTX, and every
load but those whose addresses derive only from the arguments in EARLY_READS — weights (never
written during a pass), positions, K/V slots and block tables (written before a pass's first kernel
starts), the decode attention's first key tile (without the newest key, which the previous kernel
writes)."""

import re

import pytest
import triton

from rlt.kernels import occupancy as occ

# These tests parse PTX and SASS, whose text changes between Triton releases: they run on the
# releases they were checked on (3.6: the GPU machine's and CI's; 3.9), and skip elsewhere (e.g.
# 3.7, which PyPI's torch 2.13 pins).
TESTED_TRITON = ((3, 6), (3, 9))  # (major, minor) releases
_TRITON = tuple(int(p) for p in re.findall(r"\d+", triton.__version__)[:2])
compiler_output = pytest.mark.skipif(
    _TRITON not in TESTED_TRITON,
    reason=f"parses compiler output of triton {', '.join(f'{a}.{b}.x' for a, b in TESTED_TRITON)}; "
    f"this is triton {triton.__version__}",
)


def kernels():
    from rlt.kernels import activation, decode_attention, gemv, gemv_rows, norm, qkv_rope, rope

    i, f, p16, p32, p64 = "i32", "fp32", "*bf16", "*fp32", "*i64"
    gemv_args = occ.GEMV_SIGNATURE

    rope_ptrs = dict(
        q_ptr=p16,
        k_ptr=p16,
        v_ptr=p16,
        pos_ptr=p64,
        inv_ptr=p32,
        q_bias_ptr=p16,
        k_bias_ptr=p16,
        cache_ptr=p16,
        slot_ptr=p64,
    )
    rope_ints = dict(
        layer=i,
        **{
            f"stride_{s}": i
            for s in ("qt", "qh", "kt", "kh", "vt", "vh", "cb", "cl", "ckv", "co", "ch")
        },
    )
    rope_consts = dict(
        HQ=16, HKV=16, HALF=64, HALF_PAD=64, PAIRS=False, BIAS=True, WRITE_KV=True, BLOCK_SIZE=16
    )

    def decode_case(splits):
        args = dict(
            q_ptr=p16,
            o_ptr=p16,
            part_ptr=p32,
            ml_ptr=p32,
            cache_ptr=p16,
            table_ptr=p64,
            pos_ptr=p64,
            layer=i,
            scale=f,
            stride_qt=i,
            stride_qh=i,
            stride_ot=i,
            stride_oh=i,
            stride_cb=i,
            stride_cl=i,
            stride_ckv=i,
            stride_co=i,
            stride_ch=i,
            stride_ts=i,
        )
        return (
            decode_attention._decode_kernel,
            args,
            dict(
                H=16,
                GROUP=1,
                G_PAD=16,
                BLOCK_SIZE=16,
                HEAD_DIM=128,
                D_PAD=128,
                BLOCK_N=32,
                SPLITS=splits,
                IEEE=False,
            ),
        )

    def gemv_case(epilogue, early=1):
        return (
            gemv._gemv_kernel,
            gemv_args,
            dict(BLOCK_N=2, BLOCK_K=1024, EPILOGUE=epilogue, EARLY=early),
        )

    def gemv_rows_case(epilogue):
        ptrs = dict(x_ptr=p16, w_ptr=p16, y_ptr=p16)
        args = dict(ptrs, N=i, K=i, stride_xm=i, stride_wn=i, stride_ym=i)
        return (
            gemv_rows._gemv_rows_kernel,
            args,
            dict(BLOCK_N=1, BLOCK_K=1024, EPILOGUE=epilogue),
        )

    add_norm_args = dict(
        x_ptr=p16,
        a_ptr=p16,
        wa_ptr=p16,
        wo_ptr=p16,
        xo_ptr=p16,
        h_ptr=p16,
        gw_ptr=p32,
        gb_ptr=p32,
        gate_ptr=p32,
        stride_x=i,
        stride_a=i,
        stride_xo=i,
        stride_h=i,
        N=i,
        eps=f,
    )

    return {
        "gemv": gemv_case(gemv.PLAIN),
        "gemv_swiglu": gemv_case(gemv.SWIGLU),
        "gemv_early3": gemv_case(gemv.PLAIN, 3),
        "gemv_rows": gemv_rows_case(gemv.PLAIN),
        "gemv_rows_swiglu": gemv_rows_case(gemv.SWIGLU),
        "decode": decode_case(8),
        "decode_unsplit": decode_case(1),
        "decode_merge": (
            decode_attention._merge_kernel,
            dict(o_ptr=p16, part_ptr=p32, ml_ptr=p32, pos_ptr=p64, stride_ot=i, stride_oh=i),
            dict(H=16, HEAD_DIM=128, D_PAD=128, BLOCK_N=32, SPLITS=8),
        ),
        "qkv_rope": (
            qkv_rope._qkv_rope_kernel,
            dict(
                x_ptr=p16,
                w_ptr=p16,
                q_ptr=p16,
                cache_ptr=p16,
                pos_ptr=p64,
                inv_ptr=p32,
                slot_ptr=p64,
                layer=i,
                K=i,
            )
            | {f"stride_{n}": i for n in ("wn", "qh", "cb", "cl", "ckv", "co", "ch")},
            dict(HQ=16, HKV=16, HALF=64, BLOCK_SIZE=16, BLOCK_K=1024),
        ),
        "add_rms_norm": (
            norm._add_rms_norm_kernel,
            add_norm_args,
            dict(NORM_A=False, GATE=False, BLOCK=2048),
        ),
        "add_rms_norm_gate": (
            norm._add_rms_norm_kernel,
            add_norm_args,
            dict(NORM_A=True, GATE=True, BLOCK=2048),
        ),
        "rms_norm": (
            norm._rms_norm_kernel,
            dict(x_ptr=p16, w_ptr=p16, y_ptr=p16, stride_x=i, stride_y=i, N=i, eps=f),
            dict(BLOCK=2048),
        ),
        "rope": (rope._rope_kernel, {**rope_ptrs, **rope_ints}, rope_consts),
        "rope_tokens": (
            rope._rope_tokens_kernel,
            {**rope_ptrs, "T": i, **rope_ints},
            dict(rope_consts, HQ_PAD=16, HKV_PAD=16, BLOCK_T=rope.BLOCK_T),
        ),
        "silu_mul": (
            activation._silu_mul_kernel,
            dict(gu_ptr=p16, out_ptr=p16, stride_gu=i, stride_out=i, N=i),
            dict(BLOCK=1024),
        ),
    }


# What a kernel may read before its PDL wait: memory no kernel of the pass writes while it runs.
EARLY_READS = {
    "gemv": {"w_ptr"},
    "gemv_swiglu": {"w_ptr"},
    "gemv_early3": {"w_ptr"},
    "gemv_rows": {"w_ptr"},
    "gemv_rows_swiglu": {"w_ptr"},
    "decode": {"pos_ptr", "table_ptr", "cache_ptr"},
    "decode_unsplit": {"pos_ptr"},  # unsplit passes read the cache after the wait
    "decode_merge": {"pos_ptr"},  # (its working slices' count)
    "rope": {"pos_ptr", "inv_ptr", "slot_ptr"},
    "qkv_rope": {"w_ptr", "pos_ptr", "inv_ptr", "slot_ptr"},
    "rope_tokens": {"pos_ptr", "inv_ptr", "slot_ptr"},
    "rms_norm": {"w_ptr"},
    "add_rms_norm": {"wo_ptr"},
    "add_rms_norm_gate": {"wa_ptr", "wo_ptr", "gw_ptr", "gb_ptr"},
}


def early_global_reads(ptx: str, sig: dict[str, str]) -> set[str]:
    """The pointer arguments that the addresses of global loads before griddepcontrol.wait derive
    from: a forward pass over the PTX tracking which pointers each register depends on (through
    arithmetic and through loaded values, so a block-table lookup carries the table's pointer)."""
    params = [name if kind.startswith("*") else None for name, kind in sig.items()]
    deps: dict[str, set[str]] = {}
    used: set[str] = set()
    for line in ptx[: ptx.index("griddepcontrol.wait")].splitlines():
        line = re.sub(r"^@!?%\w+\s+", "", line.split("//")[0].strip().rstrip(";").strip())
        if not line or line[0] in "/.{}$" or len(line.split()) < 2:
            continue
        op, operands = line.split(None, 1)
        m = (
            re.match(r"(%\w+),\s*\[\w+_param_(\d+)", operands)
            if op.startswith("ld.param")
            else None
        )
        if m:
            i = int(m[2])
            deps[m[1]] = {params[i]} if i < len(params) and params[i] else set()
            continue
        if operands.startswith("{"):
            group, rest = operands[1:].split("}", 1)
            dsts, srcs = re.findall(r"%\w+", group), re.findall(r"%\w+", rest)
        else:
            regs = re.findall(r"%\w+", operands)
            dsts, srcs = regs[:1], regs[1:]
        src_deps = set().union(*(deps.get(r, set()) for r in srcs))
        if op.startswith("ld.global"):
            used |= src_deps
        for d in dsts:
            deps[d] = src_deps
    return used


def ptx_of(name: str, pdl: bool) -> str:
    """kernels()[name] compiled for sm_90, with or without PDL."""
    fn, sig, consts = kernels()[name]
    return occ.compile_sm90(fn, sig, {**consts, "PDL": pdl}).asm["ptx"]


@compiler_output
@pytest.mark.parametrize(
    "name",
    [
        "gemv",
        "gemv_swiglu",
        "gemv_early3",
        "gemv_rows",
        "gemv_rows_swiglu",
        "decode",
        "decode_unsplit",
        "decode_merge",
        "add_rms_norm",
        "add_rms_norm_gate",
        "rms_norm",
        "rope",
        "rope_tokens",
        "qkv_rope",
        "silu_mul",
    ],
)
def test_pdl_kernel_waits_before_touching_memory(name):
    """With PDL a kernel releases the next one, then waits, then reads what other kernels write."""
    sig = kernels()[name][1]
    ptx = {pdl: ptx_of(name, pdl) for pdl in (True, False)}
    body = ptx[True]
    wait = body.index("griddepcontrol.wait")
    # nothing written before the wait
    assert not re.findall(r"\b(st|atom|red)\.global", body[:wait])
    early = early_global_reads(body, sig)
    allowed = EARLY_READS.get(name, set())
    assert early <= allowed, early - allowed  # e.g. q, the new k/v, x or a residual read too early
    assert early == allowed  # the early reads are really there
    assert re.search(r"\bld\.global", body[wait:])
    assert body.index("griddepcontrol.launch_dependents") < wait  # the next kernel released first
    assert "griddepcontrol" not in ptx[False]


@compiler_output
def test_gemv_reads_its_early_tiles_before_the_wait():
    """EARLY=3: three weight tiles' loads come before the PDL wait, one tile's with EARLY=1."""

    def loads_before_wait(name):
        body = ptx_of(name, True)
        return len(re.findall(r"\bld\.global", body[: body.index("griddepcontrol.wait")]))

    one = loads_before_wait("gemv")
    assert one > 0 and loads_before_wait("gemv_early3") == 3 * one


def test_split_plan(monkeypatch):
    """Key slices of decode attention: two to four programs per SM, at most MAX_SPLITS; never split
    with a program per SM."""
    from rlt.kernels import decode_attention as da

    monkeypatch.setattr(da, "num_sms", lambda device: 132)
    # Ouro, 16 KV heads
    assert [da.plan_splits(rows, 16, None) for rows in (1, 4, 8, 9)] == [32, 8, 4, 1]


def test_resident_programs():
    """Programs per SM from registers (allocated per warp in units of 256), warps, shared memory
    and the 32-program cap."""
    assert [
        occ.resident(r, w) for r, w in ((56, 4), (64, 4), (80, 4), (34, 4), (96, 4), (16, 1))
    ] == [
        9,
        8,
        6,
        12,
        5,
        32,
    ]
    assert occ.resident(40, 4, 100 * 1024) == 2 and occ.resident(40, 4, 0) == 12


@compiler_output
def test_gemv_registers():
    """ptxas's register count for a GEMV variant (sm_90a): a tile twice as wide holds more weights and
    sums in registers."""
    from rlt.kernels import gemv

    (wide, _), (narrow, _) = (
        occ.gemv_registers(gemv.GemvConfig(2, k, 4), gemv.PLAIN) for k in (2048, 1024)
    )
    assert 0 < narrow < wide <= 255
