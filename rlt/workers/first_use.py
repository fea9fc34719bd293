"""Work a worker does the first time it meets a shape: CUDA-graph captures and Triton
specializations compiled (or loaded from Triton's disk cache) in this process. Counted so that
stats() shows what happened after READY: each one stalls the passes of every request on the worker.
Once the worker is ready each is also named in its log, so a missing warm-up case can be found."""


class FirstUse:
    captures = 0
    compiles = 0
    ready = False  # set when READY is sent: from then on each one is logged

    @classmethod
    def log(cls, what: str) -> None:
        if cls.ready:
            print(f"first use after READY: {what}", flush=True)


def count_triton_compiles() -> None:
    """Count every Triton specialization this process builds or loads (the JIT's cache hook, called
    once per specialization missing from its in-memory cache; returning False lets it proceed)."""
    from triton import knobs

    def hook(*, repr, **_) -> bool:  # noqa: A002 - the hook's keyword
        FirstUse.compiles += 1
        FirstUse.log(f"Triton {' '.join(repr.split())}")
        return False

    if knobs.runtime.jit_cache_hook is None:
        knobs.runtime.jit_cache_hook = hook
