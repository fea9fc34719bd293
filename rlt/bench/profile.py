"""Where a decode step's time goes: GPU busy and idle time from a torch.profiler trace, with the
busy time split among kernels that overlap (programmatic dependent launch starts each before the
previous one ends, so their durations overstate their cost), and host time under cProfile.
"""

import cProfile
import json
import pstats
import re
import tempfile
import time

import torch


def attribute_busy(kernels: list[tuple[str, float, float]]) -> dict[str, float]:
    """(label, start, end) intervals -> {label: busy time it adds}: in start order, each kernel
    gets the part of its interval past the latest end of the kernels before it (their union is
    the busy time; idle gaps go to no one)."""
    out, end = {}, float("-inf")
    for label, a, b in sorted(kernels, key=lambda k: k[1]):
        out[label] = out.get(label, 0.0) + max(0.0, b - max(a, end))
        end = max(end, b)
    return out


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals."""
    return sum(attribute_busy([("", a, b) for a, b in intervals]).values())


def short_name(kernel: str) -> str:
    """A kernel's name without return type, template arguments and parameters:
    'void at::native::(anonymous namespace)::foo<float>(...)' -> 'at::native::anon::foo'."""
    name = re.sub(r"^(void |std::enable_if<.*?>::type )", "", kernel).replace("(anonymous namespace)", "anon")
    return re.split(r"[<(]", name, maxsplit=1)[0].strip()[:80]


def labelled_kernels(trace: dict) -> list[tuple[str, float, float]]:
    """A chrome trace's GPU kernels as (name [grid] after previous, start, end) in µs; the label
    tells the projections of a layer apart."""
    ks = sorted((e for e in trace["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    out, prev = [], "-"
    for e in ks:
        name = short_name(e["name"])
        grid = "x".join(map(str, e.get("args", {}).get("grid", [])))
        out.append((f"{name} [{grid}] after {prev}", e["ts"], e["ts"] + e["dur"]))
        prev = name
    return out


def traced_kernels(prof) -> list[tuple[str, float, float]]:
    """A finished torch.profiler run's GPU kernels, as labelled_kernels gives them."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            return labelled_kernels(json.load(trace))


def gpu_profile(engine, steps: int, top: int = 15) -> dict:
    """Two windows of `steps` engine steps on a warm CUDA engine whose requests all keep decoding:
    one plain (tokens per second), one under torch.profiler (GPU busy time per step, the idle
    fraction, the kernels taking the most GPU time and the busy time each kernel adds beyond those
    started before it, per (kernel, grid, previous kernel))."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0, tokens = time.perf_counter(), 0
    for _ in range(steps):
        tokens += len(engine.step())
    torch.cuda.synchronize()
    clean = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    critical = attribute_busy(traced_kernels(prof))
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = busy_us([(e.time_range.start, e.time_range.end) for e in kernels])
    per = {}
    for e in kernels:
        n, t = per.get(e.name, (0, 0.0))
        per[e.name] = (n + 1, t + e.time_range.elapsed_us())
    return {
        "steps": steps,
        "clean_ms_per_step": round(clean / steps * 1e3, 3),
        "tok_per_s": round(tokens / clean, 1),
        "wall_ms_per_step": round(wall / steps * 1e3, 3),
        "gpu_busy_ms_per_step": round(busy / steps / 1e3, 3),
        "gpu_idle_fraction": round(1 - busy / (wall * 1e6), 3),
        "kernels_per_step": round(len(kernels) / steps, 1),
        "top": [
            {"kernel": k[:90], "per_step": round(n / steps, 1), "us_per_step": round(t / steps, 1)}
            for k, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]
        ],
        "busy_by_kernel": [
            {"kernel": k, "us_per_step": round(t / steps, 1)}
            for k, t in sorted(critical.items(), key=lambda kv: -kv[1])[:top]
        ],
    }


def host_profile(engine, steps: int, device: str) -> tuple[float, pstats.Stats]:
    """`steps` engine steps under cProfile: (seconds per step, the profile)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        engine.step()
    sync()
    prof.disable()
    return (time.perf_counter() - t0) / steps, pstats.Stats(prof)
