"""Triton kernels checked on the CPU through Triton's interpreter (a subprocess: the interpreter
must be chosen before triton is first imported)."""

import os
import subprocess
import sys


def test_kernels_match_references_interpreted():
    """Decode attention (MHA and GQA groups, split and whole), the general paged kernel (whole and
    with its keys split, a head or a GQA group's heads per item; a pass graph's inputs), every GEMV
    config plain and with its SwiGLU, more K tiles before the wait, the two-row GEMV, RoPE with the
    KV store (and as the one-row q/k/v product's epilogue), the norms, the penalty slots, the
    finalize copies, steady decode's lane rows and latent checks."""
    here = os.path.dirname(__file__)
    path = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    r = subprocess.run(
        [sys.executable, os.path.join(here, "interpreted_kernels.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    from rlt.kernels.gemv import CONFIGS

    # decode, paged (5 plans, a pass graph's inputs), GEMV configs and epilogues, 2 and 3 early
    # tiles, the two-row GEMV, RoPE (a program per head, then per two tokens),
    # norms, penalties, KV copies, lane rows and checks
    assert (
        r.stdout.count("max error") == 6 + 5 + 1 + len(CONFIGS) * 2 + 2 + 1 + 4 + 1 + 2 + 1 + 1 + 1
    ), r.stdout
    # the q/k/v product with RoPE
    assert r.stdout.count("equal to gemv + rope_write_kv: True") == 2, r.stdout


def test_skinny_gemm_matches_the_product_interpreted():
    """The skinny GEMM the engine takes for few-row products (its CONFIG, K split, and one config
    whole) against the float32 product: rows 2 to 32, ragged N and K, plain and with the SwiGLU;
    every split launch's arrival counters back at zero."""
    from rlt.kernels.skinny_gemm import CONFIG, CONFIGS

    whole = next(i for i, c in enumerate(CONFIGS) if c.split_k == 1)
    here = os.path.dirname(__file__)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    argv = [
        sys.executable,
        os.path.join(here, "skinny_gemm_interpreted.py"),
        str(CONFIGS.index(CONFIG)),
        str(whole),
    ]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("max error") == 2 * 2 * 3 * 5 and "ok" in r.stdout.splitlines()[-1], (
        r.stdout
    )
