"""A worker's grammar compiles, in child processes of its own: a bounded pool that no request can
wedge. xgrammar's compile cannot be interrupted in a thread, and one grammar may take minutes and
gigabytes, so each compile runs in a child process; a compile past its deadline, or whose requests
have all gone, is abandoned by killing its child (its memory goes back to the system) and a fresh
child takes its place. Children fork from a zygote process that imported xgrammar and built the
tokenizer info once (rlt/workers/grammar_zygote.py, with what they run): a child, or a replacement,
starts in milliseconds. The result comes back serialized and is read into the worker against its own
tokenizer info; identical specs compile once (the worker's cache, rlt/workers/grammar.py). The
smallest queued spec goes first, and with two or more children the first takes small specs only: a
few large compiles cannot hold a small schema back. All run at nice 10. A dispatcher thread owns
them: the worker's pass loop only looks at futures.

A GPU worker starts the zygote and its children beside its warm-up, and READY waits for them (the
zygote's start is ~2 s of CPU); a CPU worker, which warms nothing up, at its first grammar, with one
child, and a second when a job waits while the first is busy.
"""

import gc
import socket
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import wait

from rlt.workers.grammar_zygote import Child, GrammarError, Zygote, _tokenizer_info

SMALL_SPEC = 16 << 10  # characters of a spec the express child takes (a few-field schema is ~1 KiB)


class CompilePool:
    """Specs -> futures of compiled grammars, at most `processes` compiling at once; others queue.
    One per process and model (shared()): a test process's engines share it. Each spec is one job
    whatever its waiters; a job whose waiters have all cancelled is dropped, or its child killed."""

    _shared: dict[tuple, "CompilePool"] = {}

    @classmethod
    def shared(cls, mc, processes: int, timeout: float) -> "CompilePool":
        key = (mc.path, mc.vocab_size, tuple(mc.eos_token_ids), processes, timeout)
        if key not in cls._shared:
            cls._shared[key] = cls(mc, processes, timeout)
        return cls._shared[key]

    def __init__(self, mc, processes: int, timeout: float):
        self.mc, self.timeout, self.processes = mc, timeout, processes
        # xgrammar's tokenizer info, to read results into: built in the dispatcher's thread
        self.info = None
        self._lock = threading.Lock()
        # spec -> the futures of its job, queued or running
        self._waiters: dict[tuple, list[Future]] = {}
        self._queued: list[tuple] = []  # specs not yet given to a child
        self._zygote = Zygote(mc.path, mc.vocab_size, mc.eos_token_ids)
        # children, None where one is to be forked (once the zygote is ready): more as jobs wait
        # (grow())
        self._children: list[Child | None] = [None]
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name="rlt-grammar", daemon=True)
        self._thread.start()

    def grow(self) -> None:
        """Every child (a GPU worker, before READY; otherwise a second one starts when a job waits
        while the first is busy)."""
        with self._lock:
            self._children += [None] * (self.processes - len(self._children))
        self._wake()

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every child runs (the worker's READY waits for them)."""
        end = time.monotonic() + timeout
        while self.info is None or not all(self._children):
            if time.monotonic() > end:
                raise RuntimeError(
                    f"the grammar compile processes did not start within {timeout:g} s"
                )
            time.sleep(0.01)

    def submit(self, spec) -> Future:
        future = Future()
        with self._lock:
            if spec not in self._waiters:
                self._waiters[spec] = []
                self._queued.append(spec)
            self._waiters[spec].append(future)
        self._wake()
        return future

    def cancel(self, spec, future: Future) -> None:
        """future's waiter has gone: once a job has none, it is dropped, or its compile killed."""
        with self._lock:
            waiters = self._waiters.get(spec, [])
            if future in waiters:
                waiters.remove(future)
                future.cancel()
            if waiters or spec not in self._waiters:
                return
            if spec in self._queued:
                self._queued.remove(spec)
                del self._waiters[spec]
            for c in self._children:
                if c.spec == spec:
                    c.deadline = 0.0  # (the dispatcher kills it at once)
        self._wake()

    def _next_job(self, express: bool):
        """The smallest queued spec (a small schema does not wait behind large ones); the express
        child takes small ones only (large ones cannot hold every child)."""
        spec = min(self._queued, key=lambda q: len(q[1]), default=None)
        if spec is None or (express and len(spec[1]) > SMALL_SPEC):
            return None
        self._queued.remove(spec)
        return spec

    def stuck(self) -> str | None:
        """Why the pool cannot compile now (every child past its deadline and not yet replaced, or
        the zygote not ready within a minute): the worker's /health says so."""
        now = time.monotonic()
        if all(
            c is not None and c.spec is not None and now > c.deadline + 5.0 for c in self._children
        ):
            return "every grammar compile process is past its deadline"
        if not self._zygote.ready and now > self._zygote.started + 60.0:
            return "no grammar compile process has started within 60 s"
        return None

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _run(self) -> None:
        # (xgrammar's import and the tokenizer's load take ~1 s: not on the worker's pass loop)
        self.info = _tokenizer_info(self.mc.path, self.mc.vocab_size, self.mc.eos_token_ids)
        # The import's objects (tens of thousands, here for good) frozen as the worker's heap was at
        # READY: a full collection on the pass loop then scans only objects made since (~20 ms
        # else).
        gc.freeze()
        while True:
            now = time.monotonic()
            busy = [c for c in self._children if c is not None and c.spec is not None]
            timeout = min((c.deadline for c in busy), default=now + 1.0) - now
            conns = [c.conn for c in self._children if c is not None]
            ready = wait([self._wake_r, self._zygote.ctl, *conns], max(0.0, timeout))
            if self._wake_r in ready:
                self._wake_r.recv(4096)
            with self._lock:
                if self._zygote.ctl in ready:  # ready, or gone (it says nothing else unasked)
                    if self._zygote.ready or self._zygote.ctl.recv(1) != b"r":
                        self._restart_zygote()
                    else:
                        self._zygote.ready = True
                for i, c in enumerate(self._children):
                    if c is None:
                        continue
                    if c.conn in ready:
                        self._receive(i, c)
                    elif c.spec is not None and time.monotonic() >= c.deadline:
                        self._abandon(i, c)
                if self._queued and len(self._children) < self.processes and all(self._children):
                    if all(c.spec is not None for c in self._children):  # (a job waits for a child)
                        self._children.append(None)
                try:
                    for i, c in enumerate(self._children):
                        if c is None and self._zygote.ready:
                            self._children[i] = self._zygote.fork()
                except OSError:
                    self._restart_zygote()
                for i, c in enumerate(self._children):
                    if c is not None and c.spec is None:
                        spec = self._next_job(express=i == 0 and len(self._children) > 1)
                        if spec is not None:
                            c.spec, c.deadline = spec, time.monotonic() + self.timeout
                            try:
                                c.conn.send(spec)
                            except OSError:
                                self._abandon(i, c, "the compile process died")

    def _restart_zygote(self) -> None:
        """The zygote died (killed by the system for its memory, say; its children with it): a new one."""
        old = self._zygote
        old.kill()
        self._zygote = Zygote(self.mc.path, self.mc.vocab_size, self.mc.eos_token_ids)
        if not old.ready:  # (stuck() counts from the first of those that never started)
            self._zygote.started = old.started

    def _finish(self, spec, result=None, error: str | None = None) -> None:
        for future in self._waiters.pop(spec, []):
            if future.set_running_or_notify_cancel():
                future.set_exception(
                    GrammarError(error)
                ) if error is not None else future.set_result(result)

    def _receive(self, i: int, c: Child) -> None:
        try:
            ok, value = c.conn.recv()
        except (EOFError, OSError):  # it died (killed by the system for its memory, say)
            return self._abandon(i, c, "the compile process died")
        spec, c.spec = c.spec, None
        if not ok:
            return self._finish(spec, error=value)
        import xgrammar as xgr

        self._finish(spec, xgr.CompiledGrammar.deserialize_json(value, self.info))

    def _abandon(self, i: int, c: Child, why: str | None = None) -> None:
        """Kill c (its compile timed out, died, or nobody waits for it); the zygote forks its replacement."""
        spec, timed_out = c.spec, c.deadline > 0.0
        c.kill()
        self._children[i] = None
        if spec is not None:
            why = why or (
                f"did not compile within {self.timeout:g} s (grammar_compile_timeout)"
                if timed_out
                else "abandoned"
            )
            self._finish(spec, error=f"structured_output.{spec[0]}: {why}")
