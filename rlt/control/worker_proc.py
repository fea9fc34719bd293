"""One worker subprocess as the coordinator sees it: spawn, handshake, liveness, stop."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass

from rlt import envs
from rlt.contract import protocol as pr
from rlt.control.forkserver import ForkServer, exit_code
from rlt.errors import EngineDeadError


@dataclass
class Credits:
    """What the coordinator has assigned to a worker and not yet seen released."""

    blocks: int = 0
    slots: int = 0

    def take(self, blocks: int) -> None:
        self.blocks += blocks
        self.slots += 1

    def give(self, blocks: int) -> None:
        self.blocks -= blocks
        self.slots -= 1


class PrefixIndex:
    """The prompt blocks the coordinator has sent a worker, most recent last: an estimate of its
    prefix cache (the worker evicts by its own LRU), bounded by the blocks its pool holds."""

    def __init__(self):
        self._keys: OrderedDict[bytes, None] = OrderedDict()

    def match(self, keys: list[bytes]) -> int:
        n = 0
        while n < len(keys) and keys[n] in self._keys:
            n += 1
        return n

    def add(self, keys: list[bytes], capacity: int) -> None:
        """capacity: the logical blocks (every plane) the worker's pool holds. The head of a prompt
        is touched last: forgotten last, as the worker evicts a prefix's tail first."""
        for k in reversed(keys):
            self._keys[k] = None
            self._keys.move_to_end(k)
        while len(self._keys) > capacity:
            self._keys.popitem(last=False)


class WorkerProc:
    def __init__(
        self,
        slot: int,
        index: int,
        role: str,
        device: str,
        incarnation: int,
        addr: str,
        log_dir: str,
    ):
        self.slot, self.index, self.role, self.device, self.incarnation = (
            slot,
            index,
            role,
            device,
            incarnation,
        )
        self.identity = f"{role}{index}.{incarnation}"
        self.addr = addr
        self.log_path = os.path.join(log_dir, f"{self.identity}.log")
        self.pid: int | None = None
        self.ready: pr.Ready | None = None
        self.stats = pr.Stats(0, 0, 0)
        self.last_seen = time.monotonic()
        self.fatal: str | None = None  # the worker's own error text, if it sent one
        # set when the coordinator kills it (no heartbeat, stuck)
        self.killed_because: str | None = None
        self.progress, self.progress_at, self.busy = -1, time.monotonic(), False
        self.trouble: str | None = None  # its last heartbeat's reason it cannot serve
        self.credits = Credits()
        self.prefixes = PrefixIndex()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.sender: asyncio.Task | None = None
        self.ready_future = asyncio.get_running_loop().create_future()

    async def spawn(self, handshake_timeout: float) -> None:
        """Start the worker without holding the caller's loop, and watch for its exit on the loop. A
        CPU worker forks from the process's fork server (rlt/control/forkserver.py); another is
        spawned: Popen (vfork + exec, no copy of a large coordinator's page tables, which a fork
        from the loop thread would make) in a thread, its exit seen through a pidfd."""
        self._log = open(self.log_path, "wb")
        args = [
            "--addr",
            self.addr,
            "--identity",
            self.identity,
            "--handshake-timeout",
            str(handshake_timeout),
        ]
        loop = asyncio.get_running_loop()
        self._exit = loop.create_future()
        if self.device == "cpu":
            self.pid, status = await asyncio.to_thread(
                ForkServer.fork, args, envs.worker_environ(), self._log.fileno(), handshake_timeout
            )

            def exited() -> None:
                loop.remove_reader(status)
                self._exit.set_result(exit_code(status))

            loop.add_reader(status, exited)
            return
        proc = await asyncio.to_thread(
            subprocess.Popen,
            [
                sys.executable,
                "-u",
                "-m",
                "rlt.workers.worker_main",
                *args,
                "--parent-pid",
                str(os.getpid()),
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            env=envs.worker_environ(),
            # its own process group: a terminal's Ctrl-C goes to the coordinator only
            start_new_session=True,
        )
        self.pid = proc.pid
        pidfd = os.pidfd_open(self.pid)

        def reap() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._exit.set_result(proc.wait())  # exited: wait() returns at once

        loop.add_reader(pidfd, reap)

    @property
    def alive(self) -> bool:
        """Spawned and not yet seen exiting."""
        return self.pid is not None and not self._exit.done()

    async def wait(self) -> int:
        """The exit code (negative: the signal that ended it)."""
        return await asyncio.shield(self._exit)

    def cause(self) -> str | None:
        """What the worker itself said went wrong: its Fatal message, else the exception that ended
        its log (a traceback's last line), else None."""
        if self.fatal:
            return self.fatal
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return None
        starts = [
            i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")
        ]
        # the exception line is the first unindented line after the last traceback's frames
        if starts:
            return next(
                (ln for ln in lines[starts[-1] + 1 :] if ln.strip() and not ln[0].isspace()), None
            )
        return None

    def how_it_ended(self) -> str:
        """Why the coordinator killed it, else its exit code or signal."""
        if self.killed_because:
            return self.killed_because
        rc = self._exit.result() if self.pid is not None and self._exit.done() else None
        if rc is None:
            return "stopped answering"
        if rc < 0:
            try:
                return f"was killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"was killed by signal {-rc}"
        return f"exited with code {rc}"

    def dead_error(self) -> EngineDeadError:
        cause = self.cause()
        detail = f": {cause}" if cause else ""
        return EngineDeadError(
            f"{self.role} worker {self.index} (pid {self.pid}) {self.how_it_ended()}{detail}"
        )

    async def wait_ready(self, timeout: float) -> pr.Ready:
        """HELLO and READY within the deadline, watching the process: a crash during start-up
        surfaces with the worker's own error."""
        exited = asyncio.ensure_future(self.wait())
        try:
            done, _ = await asyncio.wait(
                {self.ready_future, exited}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if self.ready_future in done:
                return self.ready_future.result()
            if exited in done:
                await asyncio.sleep(0.05)  # let a Fatal message that raced the exit arrive
                raise RuntimeError(
                    f"{self.role} worker {self.index} failed to start: {self.cause() or self.how_it_ended()}"
                )
            cause = self.cause()
            raise TimeoutError(
                f"{self.role} worker {self.index} not ready within {timeout} s"
                + (f": {cause}" if cause else "")
            )
        finally:
            exited.cancel()

    async def stop(self, graceful_s: float = 5.0) -> None:
        if self.pid is None:
            return
        if self.alive:
            try:
                await asyncio.wait_for(self.wait(), graceful_s)
            except TimeoutError:
                self.kill()
                await self.wait()
        self._log.close()

    def kill(self, because: str | None = None) -> None:
        self.killed_because = self.killed_because or because
        if self.alive:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
