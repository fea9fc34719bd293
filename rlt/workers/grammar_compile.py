"""A worker's grammar compiles, in child processes of its own: a bounded pool that no request can
wedge. xgrammar's compile cannot be interrupted in a thread, and one grammar may take minutes and
gigabytes, so each compile runs in a child process; a compile past its deadline, or whose requests
have all gone, is abandoned by killing its child (its memory goes back to the system) and a fresh
child takes its place. Children fork from a zygote process that imported xgrammar and built the
tokenizer info once (main() below): a child, or a replacement, starts in milliseconds. The result
comes back serialized and is read into the worker against its own tokenizer info; identical specs
compile once (the worker's cache, rlt/workers/grammar.py). The smallest queued spec goes first, and
with two or more children the first takes small specs only: a few large compiles cannot hold a small
schema back. All run at nice 10. A dispatcher thread owns them: the worker's pass loop only looks at
futures.

A GPU worker starts the zygote and its children beside its warm-up, and READY waits for them (the
zygote's start is ~2 s of CPU); a CPU worker, which warms nothing up, at its first grammar, with one
child, and a second when a job waits while the first is busy.
"""

import gc
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait

from rlt.grammar import error_text

SMALL_SPEC = 16 << 10  # characters of a spec the express child takes (a few-field schema is ~1 KiB)


class GrammarError(Exception):
    """A spec that did not compile: its message names the field (structured_output.<kind>: ...)."""


def tokenizer_info(tokenizer, vocab_size: int, eos_token_ids):
    """xgrammar's view of the model's whole vocabulary (ids past the tokenizer's never allowed); the
    model's EOS ids are the grammars' stop tokens."""
    import xgrammar as xgr

    return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(eos_token_ids))


def _tokenizer_info(path: str, vocab_size: int, eos_token_ids):
    from rlt.models.tokenizer import load_tokenizer

    return tokenizer_info(load_tokenizer(path), vocab_size, eos_token_ids)


def compile_spec(compiler, spec):
    """-> the compiled grammar; GrammarError if it does not compile or can match nothing."""
    import xgrammar as xgr

    from rlt.grammar import grammar_of

    try:
        compiled = compiler.compile_grammar(grammar_of(spec))
    except Exception as e:  # noqa: BLE001 - xgrammar's errors are the spec's
        raise GrammarError(error_text(spec, e)) from None
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
    matcher.fill_next_token_bitmask(mask, 0)
    if not mask.any():  # (a grammar that may end at once allows the stop tokens)
        raise GrammarError(f"structured_output.{spec[0]}: no output can match it")
    return compiled


_ZYGOTE = "import os; os.nice(10); import rlt.workers.grammar_compile as c; os._exit(c.main())"


class _Zygote:
    """The process compile children fork from (main() below): xgrammar imported and the tokenizer
    info built once (~2 s of CPU), so a child, or its replacement after a kill, starts in a few
    milliseconds. It says b"r" when ready; fork() hands it one end of a socket pair (SCM_RIGHTS)."""

    def __init__(self, path: str, vocab_size: int, eos_token_ids):
        here, there = socket.socketpair()
        # (-c, not -m: the process runs this module's main as imported, as a test's fault injection patches it)
        args = [sys.executable, "-c", _ZYGOTE, str(there.fileno()), path, str(vocab_size)]
        self.proc = subprocess.Popen([*args, ",".join(map(str, eos_token_ids))], pass_fds=[there.fileno()])
        there.close()
        self.ctl, self.ready, self.started = here, False, time.monotonic()

    def fork(self) -> "_Child":
        here, there = socket.socketpair()
        socket.send_fds(self.ctl, [b"f"], [there.fileno()])
        there.close()
        pid = b""
        while len(pid) < 4:
            if not (more := self.ctl.recv(4 - len(pid))):
                raise ConnectionResetError("the compile zygote is gone")
            pid += more
        return _Child(struct.unpack("i", pid)[0], Connection(here.detach()))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.ctl.close()


class _Child:
    """One compile process (the zygote's child: it reaps it) and the job it runs (None: idle)."""

    def __init__(self, pid: int, conn: Connection):
        self.pid, self.conn = pid, conn
        self.spec, self.deadline = None, 0.0

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.conn.close()


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
        self.info = None  # xgrammar's tokenizer info, to read results into: built in the dispatcher's thread
        self._lock = threading.Lock()
        self._waiters: dict[tuple, list[Future]] = {}  # spec -> the futures of its job, queued or running
        self._queued: list[tuple] = []  # specs not yet given to a child
        self._zygote = _Zygote(mc.path, mc.vocab_size, mc.eos_token_ids)
        # children, None where one is to be forked (once the zygote is ready): more as jobs wait (grow())
        self._children: list[_Child | None] = [None]
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
                raise RuntimeError(f"the grammar compile processes did not start within {timeout:g} s")
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
        if all(c is not None and c.spec is not None and now > c.deadline + 5.0 for c in self._children):
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
        # READY: a full collection on the pass loop then scans only objects made since (~20 ms else).
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
        self._zygote = _Zygote(self.mc.path, self.mc.vocab_size, self.mc.eos_token_ids)
        if not old.ready:  # (stuck() counts from the first of those that never started)
            self._zygote.started = old.started

    def _finish(self, spec, result=None, error: str | None = None) -> None:
        for future in self._waiters.pop(spec, []):
            if future.set_running_or_notify_cancel():
                future.set_exception(GrammarError(error)) if error is not None else future.set_result(result)

    def _receive(self, i: int, c: _Child) -> None:
        try:
            ok, value = c.conn.recv()
        except (EOFError, OSError):  # it died (killed by the system for its memory, say)
            return self._abandon(i, c, "the compile process died")
        spec, c.spec = c.spec, None
        if not ok:
            return self._finish(spec, error=value)
        import xgrammar as xgr

        self._finish(spec, xgr.CompiledGrammar.deserialize_json(value, self.info))

    def _abandon(self, i: int, c: _Child, why: str | None = None) -> None:
        """Kill c (its compile timed out, died, or nobody waits for it); the zygote forks its replacement."""
        spec, timed_out = c.spec, c.deadline > 0.0
        c.kill()
        self._children[i] = None
        if spec is not None:
            why = why or (
                f"did not compile within {self.timeout:g} s (grammar_compile_timeout)" if timed_out else "abandoned"
            )
            self._finish(spec, error=f"structured_output.{spec[0]}: {why}")


def main() -> int:
    """The zygote: tokenizer info once, then a compile child forked for each socket the worker sends;
    a child compiles spec -> (ok, serialized grammar or error text) until its socket closes."""
    fd, path, vocab_size, eos = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    _die_with_parent()
    import xgrammar as xgr

    info = _tokenizer_info(path, vocab_size, [int(t) for t in eos.split(",") if t])
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # (the children reaped as they end)
    ctl = socket.socket(fileno=fd)
    ctl.sendall(b"r")
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(ctl, 1, 1)
        except OSError:
            return 0
        if not fds:  # the worker is gone
            return 0
        if (pid := os.fork()) == 0:
            ctl.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _die_with_parent()
            conn, compiler = Connection(fds[0]), xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            while True:
                try:
                    spec = conn.recv()
                except EOFError:  # the worker is gone
                    return 0
                try:
                    conn.send((True, compile_spec(compiler, tuple(spec)).serialize_json()))
                except GrammarError as e:
                    conn.send((False, str(e)))
        os.close(fds[0])
        ctl.sendall(struct.pack("i", pid))


def _die_with_parent() -> None:
    if sys.platform == "linux":  # killed with its parent, even mid-compile (PR_SET_PDEATHSIG)
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
