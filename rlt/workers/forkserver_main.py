"""The process a coordinator's CPU workers fork from (started by rlt/control/forkserver.py).

Importing torch and the worker's modules is most of a CPU worker's start (~2.5 s of CPU); done
once here, a worker forks in milliseconds and goes straight to its handshake (a launch of several
workers, and a restart after a crash, no longer import torch again). A GPU worker is spawned fresh
instead: its start is its weights and warm-up, and CUDA must not be initialized before a fork.

On a SOCK_SEQPACKET socket the coordinator sends, per worker, its pickled (arguments, environment)
with two descriptors: its log (stdout and stderr) and its end of a socket pair, on which this
process writes the worker's pid, then its exit code (negative: the signal) once reaped. A worker
is a session of its own (as a spawned one: a terminal's Ctrl-C goes to the coordinator only) and
dies with this process, which dies with the coordinator (PR_SET_PDEATHSIG, and the end of its socket);
with no worker for IDLE_S it exits, and the coordinator starts another when it needs one.
"""

import gc
import os
import pickle
import selectors
import signal
import socket
import struct
import sys
import traceback

from rlt import envs
from rlt.workers.lifetime import die_with_parent

IDLE_S = 30.0


def main() -> int:
    fd, parent = int(sys.argv[1]), int(sys.argv[3])  # argv: fd --parent-pid N
    die_with_parent()
    if os.getppid() != parent:  # the coordinator died before the death signal was set
        return 1
    # torch and the worker's modules, once for every worker: its loop's, and what it builds its
    # engine from (rlt/workers/worker_main.py's build)
    import rlt.models.family  # noqa: F401
    import rlt.models.loader  # noqa: F401
    import rlt.workers.engine  # noqa: F401
    import rlt.workers.worker  # noqa: F401
    import rlt.workers.worker_main  # noqa: F401

    gc.collect()
    gc.freeze()  # (the workers' collections skip the imported heap, whose pages stay shared)
    ctl = socket.socket(fileno=fd)
    wake_r, wake_w = socket.socketpair()
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (it wakes the selector: reaped in the loop)
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}  # pid -> where its exit code goes
    while True:
        events = sel.select(None if children else IDLE_S)
        if not events and not children:
            return 0
        for key, _ in events:
            if key.fileobj is wake_r:
                wake_r.recv(4096)
                _reap(children)
                continue
            try:
                msg, fds, _, _ = socket.recv_fds(ctl, 1 << 20, 2)
            except OSError:
                return 0
            if not msg:  # the coordinator is gone
                return 0
            log_fd, status_fd = fds
            status = socket.socket(fileno=status_fd)
            server, pid = os.getpid(), os.fork()
            if pid == 0:
                sel.close()
                _child(
                    pickle.loads(msg),
                    server,
                    log_fd,
                    [ctl, wake_r, wake_w, status, *children.values()],
                )
            os.close(log_fd)
            children[pid] = status
            try:
                status.sendall(struct.pack("i", pid))
            # (the coordinator gave up waiting: the worker finds no handshake and exits)
            except OSError:
                pass


def _reap(children: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if (sock := children.pop(pid, None)) is not None:
            try:
                sock.sendall(struct.pack("i", os.waitstatus_to_exitcode(status)))
            except OSError:
                pass
            sock.close()


def _child(
    request: tuple[list[str], dict[str, str]],
    server: int,
    log_fd: int,
    inherited: list[socket.socket],
) -> None:
    """The forked worker: its own session, log and environment, then the worker's main; never returns."""
    code = 1
    try:
        die_with_parent()
        if os.getppid() != server:  # the server died before the death signal was set
            os._exit(1)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for s in inherited:
            s.close()
        os.setsid()
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        args, environ = request
        envs.replace_environ(environ)
        from rlt.workers import worker_main

        code = worker_main.main([*args, "--parent-pid", str(server)])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - as the interpreter would report it, then exit
        traceback.print_exc()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)
