"""`rlt bench profile`'s parts of a pass (rlt/bench/step_parts.py): kernels sorted by name into
products, attention and the rest; each part's time against its bytes at the read rate, or against
the dense floor's same part."""

import pytest

from rlt.bench import step_parts
from rlt.cli import main


def test_kernels_sort_into_their_parts():
    """rlt's Triton kernels, cuBLAS's and SDPA's, as profile labels name them."""
    products = ["_gemv_kernel", "_gemv_rows_kernel", "_qkv_rope_kernel", "_skinny_kernel"]
    products += ["_matmul_kernel", "nvjet_tst_128x64_64x8_2x1_v_bz_TNT", "splitKreduce_kernel"]
    products += ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"]
    attention = ["_decode_kernel", "_merge_kernel", "_paged_attn_kernel"]
    attention += ["pytorch_flash::flash_fwd_kernel"]
    rest = ["_add_rms_norm_kernel", "_rms_norm_kernel", "_rope_kernel", "_silu_mul_kernel"]
    rest += ["at::native::unrolled_elementwise_kernel", "_lane_rows_kernel", "_append_kernel"]
    for names, part in ((products, "products"), (attention, "attention"), (rest, "the rest")):
        for name in names:
            assert step_parts.part_of(f"{name} [1x1x1] after _gemv_kernel") == part, name
    busy = {"_gemv_kernel [8x1x1] after -": 3.0, "_gemv_kernel [8x1x1] after _decode_kernel": 2.0}
    busy |= {"_decode_kernel [1x2x3] after _gemv_kernel": 4.0}
    assert step_parts.by_part(busy) == {"products": 5.0, "attention": 4.0, "the rest": 0.0}


def test_a_decode_step_against_its_bytes_and_a_prompt_against_its_floor():
    """A loop step's bytes are the full-depth step's over the depth; each part's fraction is its
    bytes' time at the read rate over its time; a prompt's parts are ratios to the floor's."""
    roof = {"weight_bytes": 8e9, "kv_bytes": 4e9}
    nbytes = step_parts.decode_bytes(roof, depth=4)
    assert nbytes == {"products": 2e9, "attention": 1e9, "the rest": 0.0}
    busy = {"products": 1250.0, "attention": 500.0, "the rest": 250.0}
    lines = step_parts.decode_table(busy, nbytes, read_gbps=2000.0)
    assert lines[0] == "a loop step by part (read rate 2000.0 GB/s):"
    assert (
        lines[1].split()
        == "products 1250.0 us 2.000 GB, 1000.0 us at the read rate (0.800)".split()
    )
    assert lines[2].endswith("500.0 us at the read rate (1.000)")
    assert lines[3].split() == ["the", "rest", "250.0", "us"]
    assert lines[4].endswith("1500.0 us at the read rate (0.750)")
    floor = {"products": 1000.0, "attention": 200.0, "the rest": 0.0}
    lines = step_parts.prefill_table(
        {"products": 1100.0, "attention": 220.0, "the rest": 80.0}, floor
    )
    assert lines[1].split() == "products 1100.0 us floor 1000.0 us (x1.100)".split()
    assert lines[3].split() == ["the", "rest", "80.0", "us", "floor", "0.0", "us"]
    assert lines[4].split() == "prompt 1400.0 us floor 1200.0 us (x1.167)".split()


def test_prefill_profile_needs_the_gpu(checkpoints):
    argv = ["bench", "profile", "--model", checkpoints["ouro"], "--device", "cpu", "--prefill", "2"]
    with pytest.raises(SystemExit, match="--prefill profiles the GPU's side of a prompt"):
        main(argv)
