"""Where a pass's GPU time goes, by part: the weight products, attention (with its merge), and the
rest (norms, RoPE, SwiGLU, KV writes, sampling: kernels that move few bytes, so their time is
their fixed cost). A decode step's parts stand against the bytes each must read (the products the
weights, attention the rows' KV) at the run's read rate; a prompt's against the same parts of its
dense floor (rlt/bench/floors.py). `rlt bench profile --gpu` prints them.
"""

import re

PARTS = ("products", "attention", "the rest")
# kernel names (rlt's Triton kernels, cuBLAS's, PyTorch's SDPA) -> part
_PRODUCTS = re.compile(r"gemv|gemm|qkv_rope|skinny|matmul|cutlass|xmma|nvjet|splitK|cublas", re.I)
_ATTENTION = re.compile(r"decode_kernel|merge_kernel|attn|attention|flash|fmha", re.I)


def part_of(label: str) -> str:
    """A kernel's part, from its name (a profile label's first word: 'name [grid] after prev')."""
    name = label.split(" ", 1)[0]
    if _PRODUCTS.search(name):
        return "products"
    return "attention" if _ATTENTION.search(name) else "the rest"


def by_part(busy_us: dict[str, float]) -> dict[str, float]:
    """{label: busy µs} -> {part: busy µs}, every part present."""
    out = dict.fromkeys(PARTS, 0.0)
    for label, us in busy_us.items():
        out[part_of(label)] += us
    return out


def decode_bytes(roofline: dict, depth: int) -> dict[str, float]:
    """A loop step's bytes by part, from floors.decode_roofline's full-depth step (its weights and
    head read once per loop, its KV at every loop)."""
    return {
        "products": roofline["weight_bytes"] / depth,
        "attention": roofline["kv_bytes"] / depth,
        "the rest": 0.0,
    }


def decode_table(busy: dict[str, float], nbytes: dict[str, float], read_gbps: float) -> list[str]:
    """Lines: each part's busy µs a loop step, its bytes, and the fraction of the read rate its
    time reaches (the rest: its bytes are few, its time is the parts' fixed cost)."""
    lines = [f"a loop step by part (read rate {read_gbps:.1f} GB/s):"]
    for part in (*PARTS, "step"):
        us = sum(busy.values()) if part == "step" else busy[part]
        b = sum(nbytes.values()) if part == "step" else nbytes[part]
        ideal = b / read_gbps / 1e3  # µs
        rate = f"{b / 1e9:7.3f} GB, {ideal:8.1f} us at the read rate"
        frac = f" ({ideal / us:.3f})" if b and us else ""
        lines.append(f"  {part:9} {us:8.1f} us  {rate if b else ''}{frac}")
    return lines


def prefill_table(engine_us: dict[str, float], floor_us: dict[str, float]) -> list[str]:
    """Lines: each part's busy µs a prompt against the dense floor's (its GEMMs and SDPA)."""
    lines = ["a prompt by part, against the dense floor:"]
    for part in (*PARTS, "prompt"):
        us = sum(engine_us.values()) if part == "prompt" else engine_us[part]
        fl = sum(floor_us.values()) if part == "prompt" else floor_us[part]
        ratio = f" (x{us / fl:.3f})" if fl else ""
        lines.append(f"  {part:9} {us:9.1f} us  floor {fl:9.1f} us{ratio}")
    return lines
