"""A worker's grammar compile processes (rlt/workers/grammar_compile.py runs them): a zygote that
imports xgrammar and builds the tokenizer info once (main() below), and compile children forked from
it, so a child, or the replacement of a killed one, starts in milliseconds; what they run: compile_spec
(a module global, looked up at each call: a test patches it)."""

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from multiprocessing.connection import Connection

from rlt.contract.grammar import error_text
from rlt.workers.lifetime import die_with_parent


class GrammarError(Exception):
    """A spec that did not compile: its message names the field (structured_output.<kind>: ...)."""


def tokenizer_info(tokenizer, vocab_size: int, eos_token_ids):
    """xgrammar's view of the model's whole vocabulary (ids past the tokenizer's never allowed); the
    model's EOS ids are the grammars' stop tokens."""
    import xgrammar as xgr

    return xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=list(eos_token_ids)
    )


def _tokenizer_info(path: str, vocab_size: int, eos_token_ids):
    from rlt.models.tokenizer import load_tokenizer

    return tokenizer_info(load_tokenizer(path), vocab_size, eos_token_ids)


def compile_spec(compiler, spec):
    """-> the compiled grammar; GrammarError if it does not compile or can match nothing."""
    import xgrammar as xgr

    from rlt.contract.grammar import grammar_of

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


_ZYGOTE = "import os; os.nice(10); import rlt.workers.grammar_zygote as z; os._exit(z.main())"


class Zygote:
    """The process compile children fork from (main() below): xgrammar imported and the tokenizer
    info built once (~2 s of CPU), so a child, or its replacement after a kill, starts in a few
    milliseconds. It says b"r" when ready; fork() hands it one end of a socket pair (SCM_RIGHTS)."""

    def __init__(self, path: str, vocab_size: int, eos_token_ids):
        here, there = socket.socketpair()
        # (-c, not -m: the process runs this module's main as imported, as a test's fault injection
        # patches it)
        args = [sys.executable, "-c", _ZYGOTE, str(there.fileno()), path, str(vocab_size)]
        self.proc = subprocess.Popen(
            [*args, ",".join(map(str, eos_token_ids))], pass_fds=[there.fileno()]
        )
        there.close()
        self.ctl, self.ready, self.started = here, False, time.monotonic()

    def fork(self) -> "Child":
        here, there = socket.socketpair()
        socket.send_fds(self.ctl, [b"f"], [there.fileno()])
        there.close()
        pid = b""
        while len(pid) < 4:
            if not (more := self.ctl.recv(4 - len(pid))):
                raise ConnectionResetError("the compile zygote is gone")
            pid += more
        return Child(struct.unpack("i", pid)[0], Connection(here.detach()))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.ctl.close()


class Child:
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


def main() -> int:
    """The zygote: tokenizer info once, then a compile child forked for each socket the worker sends;
    a child compiles spec -> (ok, serialized grammar or error text) until its socket closes."""
    fd, path, vocab_size, eos = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    die_with_parent()
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
            die_with_parent()
            conn, compiler = (
                Connection(fds[0]),
                xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False),
            )
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
