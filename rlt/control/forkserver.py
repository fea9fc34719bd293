"""CPU workers forked from a server process (rlt/workers/forkserver_main.py, which says why): one
per coordinator process and import-time environment, shared by its engines, started at the first
CPU worker and gone once idle (then started again when needed)."""

import concurrent.futures
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading

from rlt import envs

_MAIN = "import rlt.workers.forkserver_main as f; raise SystemExit(f.main())"
# PR_SET_PDEATHSIG fires when the *thread* that started a process ends: the server, which serves
# every event loop of the process, is started from a thread that lives as long as the process, not
# from a loop's executor (a test's closed loop took the server and its workers down).
_STARTER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlt-forkserver")


class ForkServer:
    _servers: dict[tuple, "ForkServer"] = {}
    _lock = threading.Lock()

    @classmethod
    def fork(
        cls, args: list[str], environ: dict[str, str], log_fd: int, timeout: float
    ) -> tuple[int, socket.socket]:
        """A worker (rlt.workers.worker_main's arguments, without --parent-pid) -> its pid and the
        socket its exit code arrives on. Blocks (a thread's work): the server's first fork waits
        for its imports."""
        key = envs.import_time(environ)
        for attempt in range(2):
            with cls._lock:
                server = cls._servers.get(key)
                if server is None or server.proc.poll() is not None:
                    server = cls._servers[key] = cls(environ)
            try:
                return server._fork(args, environ, log_fd, timeout)
            # it exited, idle, as the request came: once more, with a new one
            except ConnectionError:
                with cls._lock:
                    if cls._servers.get(key) is server:
                        del cls._servers[key]
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def __init__(self, environ: dict[str, str]):
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [
            sys.executable,
            "-u",
            "-c",
            _MAIN,
            str(there.fileno()),
            "--parent-pid",
            str(os.getpid()),
        ]
        # (its own session, as the workers: a terminal's Ctrl-C goes to the coordinator only)
        self.proc = _STARTER.submit(
            subprocess.Popen,
            argv,
            pass_fds=[there.fileno()],
            stdin=subprocess.DEVNULL,
            env=environ,
            start_new_session=True,
        ).result()
        there.close()
        self.ctl, self._send = here, threading.Lock()
        # (no zombie)
        threading.Thread(target=self.proc.wait, name="rlt-forkserver-reaper", daemon=True).start()

    def _fork(self, args, environ, log_fd: int, timeout: float) -> tuple[int, socket.socket]:
        here, there = socket.socketpair()
        try:
            with self._send:
                socket.send_fds(self.ctl, [pickle.dumps((args, environ))], [log_fd, there.fileno()])
        except OSError as e:
            here.close()
            raise ConnectionResetError(f"the worker fork server is gone: {e}") from None
        finally:
            there.close()
        here.settimeout(timeout)
        try:
            pid = _read_int(here)
        except TimeoutError:
            here.close()
            raise TimeoutError(
                f"the worker fork server did not fork a worker within {timeout} s"
            ) from None
        if pid is None:
            here.close()
            raise ConnectionResetError("the worker fork server exited")
        here.setblocking(False)
        return pid, here


def _read_int(sock: socket.socket) -> int | None:
    """One int the server wrote, None at EOF."""
    data = b""
    while len(data) < 4:
        if not (more := sock.recv(4 - len(data))):
            return None
        data += more
    return struct.unpack("i", data)[0]


def exit_code(sock: socket.socket) -> int:
    """A forked worker's exit code, once its socket is readable (-SIGKILL if the server died first:
    its death signal killed the worker)."""
    sock.setblocking(True)
    try:
        code = _read_int(sock)
    except OSError:
        code = None
    sock.close()
    return -signal.SIGKILL if code is None else code
