"""Work a worker does the first time it meets a shape: CUDA-graph captures and Triton
specializations compiled (or loaded from Triton's disk cache) in this process. Counted so that
stats() shows what happened after READY: each one stalls the passes of every request on the worker."""


class FirstUse:
    captures = 0
    compiles = 0


def count_triton_compiles() -> None:
    """Count every Triton specialization this process builds or loads (the JIT's cache hook, called
    once per specialization missing from its in-memory cache; returning False lets it proceed)."""
    from triton import knobs

    def hook(**_) -> bool:
        FirstUse.compiles += 1
        return False

    if knobs.runtime.jit_cache_hook is None:
        knobs.runtime.jit_cache_hook = hook
