"""In-run ceilings and floors of the offline benchmark, measured on the device in use.

* ceilings: bf16 GEMM TFLOP/s (8192^3 torch.matmul), read bandwidth (the best of a few streaming
  read-only kernels over 2 GiB: what decode does, read weights and KV) and, for reference, copy
  bandwidth (a 2 GiB device copy, bytes read + written per second: a read and a write stream share
  the bus, so a copy understates what reads alone reach);
* prefill floor: the same GEMMs + causal SDPA as the model's prefill, in plain torch on the
  model's own weights, for one prompt of n tokens at full depth, and the LM head over its last row
  (the first token's logits); norms, RoPE, KV writes excluded; one replay at a time, as a prompt;
* decode roofline: per decode step of c sequences, the core weights read once per loop plus every
  row's KV read at every loop, plus the LM head, over the measured read bandwidth.
"""

import functools
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F

from rlt.models.weights import boundary_layers, core_layers, nbytes
from rlt.models.weights import head as lm_head


def _time_ms(fn, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def _graph(fn, calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls` calls of fn, captured after a warm-up on a side stream (compilation,
    allocation) and replayed once."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def graph_us(fn, units: int = 1, calls: int = 10, reps: int = 20) -> float:
    """Microseconds per unit of fn (a call runs `units` of them), from a CUDA graph of `calls` calls
    replayed `reps` times back to back."""
    g = _graph(fn, calls)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (reps * calls * units)


def replay_ms(fn) -> Callable[[], float]:
    """fn in a CUDA graph -> a function replaying it once, alone on an idle GPU, returning its ms."""
    g = _graph(fn, 1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once() -> float:
        torch.cuda.synchronize()
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    return once


def ceilings(device: str) -> dict:
    n = 8192
    mats = [torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2)]
    gemm_ms = _time_ms(lambda: mats[0] @ mats[1])
    mats.clear()
    src = torch.empty(1 << 30, dtype=torch.int16, device=device)
    copy_gbps = round(
        2 * src.numel() * 2 / _time_ms(functools.partial(torch.empty_like(src).copy_, src)) / 1e6, 1
    )
    return {
        "gemm_tflops": round(2 * n**3 / gemm_ms / 1e9, 1),
        "read_gbps": read_gbps(src),
        "copy_gbps": copy_gbps,
    }


def read_gbps(src: torch.Tensor) -> float:
    """The best read rate over src (far larger than L2) of a few read-only kernels: programs striding
    over tiles of it, each summing what it read (checked against torch: every byte is read once)."""
    import triton

    from rlt.bench.read_triton import read_kernel

    src = src.view(torch.int32)
    sms = torch.cuda.get_device_properties(src.device).multi_processor_count
    best = 0.0
    for block, per_sm, warps in ((4096, 4, 8), (8192, 2, 8), (8192, 4, 16), (16384, 2, 16)):
        programs = min(sms * per_sm, triton.cdiv(src.numel(), block))
        sums = torch.empty(programs, dtype=torch.int64, device=src.device)
        ms = _time_ms(
            functools.partial(
                read_kernel[(programs,)], src, sums, src.numel(), BLOCK=block, num_warps=warps
            )
        )
        assert int(sums.sum()) == int(src.sum(dtype=torch.int64)), "the read kernel missed bytes"
        best = max(best, src.numel() * 4 / ms / 1e6)
    return round(best, 1)


def prefill_floor(model, mc, n: int, context: int = 0) -> Callable[[], float]:
    """Plain-torch GEMMs + SDPA of one n-token prompt through every loop, on the model's weights,
    then the head's product over the last row (no first token without it):
    causal, or with `context` > n the n rows ending a cached `context`-token prefix (a prefix hit;
    every row sees the whole context: the last rows' causal mask saves under n / context of it; its
    keys laid out per query head beforehand, so SDPA takes its flash kernel whatever the GQA). In a
    CUDA graph (run eagerly, its launches would hold the GPU back on short prompts): returns a
    function timing one replay, in ms, so a benchmark can interleave it with the passes it measures
    (clocks under a long run of GEMMs drop: back-to-back replays read slower than one prompt's)."""
    layers = core_layers(model) * mc.depth + boundary_layers(model)
    Hkv, D = mc.kv.num_kv_heads, mc.kv.head_dim
    H = layers[0][0].shape[0] // D - 2 * Hkv
    x = torch.randn(n, mc.hidden_size, device=layers[0][0].device, dtype=layers[0][0].dtype)
    kv = (
        torch.randn(2, 1, H, max(context, n), D, device=x.device, dtype=x.dtype)
        if context > n
        else None
    )
    head = lm_head(model)

    def run():
        for qkv, o, up, down in layers:
            y = x @ qkv.t()
            # [1, heads, n, D]: SDPA's fused kernels need the batch dimension (3-D inputs fall back
            # to math)
            q = y[:, : H * D].view(1, n, H, D).transpose(1, 2)
            k = y[:, H * D : (H + Hkv) * D].view(1, n, Hkv, D).transpose(1, 2)
            v = y[:, (H + Hkv) * D :].view(1, n, Hkv, D).transpose(1, 2)
            if kv is not None:
                k, v = kv
            a = F.scaled_dot_product_attention(
                q, k, v, is_causal=kv is None, enable_gqa=k.shape[1] != H
            )
            _ = a.transpose(1, 2).reshape(n, H * D) @ o.t()
            g = x @ up.t()
            _ = g[:, : down.shape[1]] @ down.t()
        _ = x[-1:] @ head.t()

    return replay_ms(run)


def prefill_floor_ms(model, mc, n: int, context: int = 0, samples: int = 7) -> float:
    """prefill_floor's median over `samples` replays."""
    once = prefill_floor(model, mc, n, context)
    return statistics.median(once() for _ in range(samples))


def decode_roofline(model, mc, concurrency: int, context: int, read_gbps: float) -> dict:
    """Time per decode step of `concurrency` sequences at `context` tokens, at full depth."""
    weights = nbytes(core_layers(model))
    # the KV pool and head use the weights' dtype
    g, es = mc.kv, core_layers(model)[0][0].element_size()
    kv_layer = context * 2 * g.num_kv_heads * g.head_dim * es  # one row's K and V of one layer
    head = lm_head(model).numel() * es
    step_bytes = (
        mc.depth * (weights + concurrency * kv_layer * g.num_core_layers)
        + head
        + concurrency * kv_layer * g.num_boundary_layers
    )
    ms = step_bytes / read_gbps / 1e6
    return {
        "bytes_per_step": step_bytes,
        "weight_bytes": mc.depth * weights + head,
        "kv_bytes": step_bytes - mc.depth * weights - head,
        "ms_per_step": round(ms, 3),
        "tok_per_s": round(concurrency / ms * 1e3, 1),
    }
