"""What a worker counts as it runs, in one object (WorkerCounters) made with its engine and passed
to what moves it: the engine's backend and its CUDA graphs at construction, the Triton compile hook
when it is installed. Read by the worker's loop (its stats), its heartbeat thread and rlt bench.

- Progress, for the heartbeat thread to tell a slow step from a stuck worker: `progress` moves with
  every main-loop iteration and with every layer a pass runs (the backend's attention), so a long
  prompt chunk keeps it moving while a hung loop or kernel does not; `busy` says the main loop has
  work; `trouble()` says what keeps the worker from serving though it beats (its grammar compiles
  stuck). Written by the main thread, read by the heartbeat thread (an int read is atomic under
  the GIL).
- First use: work done the first time a shape is met, CUDA-graph captures and Triton
  specializations compiled (or loaded from Triton's disk cache). Counted so that stats() shows what
  happened after READY: each one stalls the passes of every request on the worker. Once the worker
  is `ready` each is also named in its log, so a missing warm-up case can be found.
"""


class WorkerCounters:
    def __init__(self):
        self.progress = 0
        self.busy = False
        self.trouble = lambda: None  # -> a reason the worker cannot serve, or None
        self.captures = 0
        self.compiles = 0
        self.ready = False  # set when READY is sent: from then on each first use is logged

    def captured(self, what: str) -> None:
        """A CUDA graph captured (`what`: its shape, for the log)."""
        self.captures += 1
        self._log(f"CUDA graph of {what}")

    def compiled(self, what: str) -> None:
        """A Triton specialization built or loaded (`what`: the kernel and its specialization)."""
        self.compiles += 1
        self._log(f"Triton {what}")

    def _log(self, what: str) -> None:
        if self.ready:
            print(f"first use after READY: {what}", flush=True)


_COUNTING: list[WorkerCounters] = []  # the counters the hook counts into: the last asked for


def count_triton_compiles(counters: WorkerCounters) -> None:
    """Count every Triton specialization this process builds or loads from now on into `counters`
    (the JIT's cache hook, called once per specialization missing from its in-memory cache;
    returning False lets it proceed). One hook a process, rlt's, installed unless another is (then
    that one stays); a later call points it at its own counters (a process of several engines:
    the last one's)."""
    from triton import knobs

    _COUNTING[:] = [counters]
    if knobs.runtime.jit_cache_hook is None:
        knobs.runtime.jit_cache_hook = _hook


def _hook(*, repr, **_) -> bool:  # noqa: A002 - the hook's keyword
    _COUNTING[0].compiled(" ".join(repr.split()))
    return False
