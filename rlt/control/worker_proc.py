"""One worker subprocess as the coordinator sees it: spawn, handshake, liveness, stop."""

import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass

from rlt import protocol as pr
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


class WorkerProc:
    def __init__(self, slot: int, index: int, role: str, device: str, incarnation: int, addr: str, log_dir: str):
        self.slot, self.index, self.role, self.device, self.incarnation = slot, index, role, device, incarnation
        self.identity = f"{role}{index}.{incarnation}"
        self.addr = addr
        self.log_path = os.path.join(log_dir, f"{self.identity}.log")
        self.proc: asyncio.subprocess.Process | None = None
        self.pid: int | None = None
        self.ready: pr.Ready | None = None
        self.stats = pr.Stats(0, 0, 0)
        self.last_seen = time.monotonic()
        self.fatal: str | None = None  # the worker's own error text, if it sent one
        self.progress, self.progress_at, self.busy = -1, time.monotonic(), False
        self.credits = Credits()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.sender: asyncio.Task | None = None
        self.ready_future = asyncio.get_running_loop().create_future()

    async def spawn(self, handshake_timeout: float) -> None:
        self._log = open(self.log_path, "wb")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-u",
            "-m",
            "rlt.workers.worker_main",
            "--addr",
            self.addr,
            "--identity",
            self.identity,
            "--handshake-timeout",
            str(handshake_timeout),
            "--parent-pid",
            str(os.getpid()),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,  # its own process group: a terminal's Ctrl-C goes to the coordinator only
        )
        self.pid = self.proc.pid

    def error_text(self) -> str:
        """The worker's own error: its Fatal message, else the tail of its log, else its exit code."""
        if self.fatal:
            return self.fatal
        try:
            with open(self.log_path, "rb") as f:
                lines = [ln for ln in f.read().decode(errors="replace").strip().splitlines() if ln.strip()]
            if lines:
                return lines[-1]
        except OSError:
            pass
        rc = self.proc.returncode if self.proc else None
        return f"worker exited with code {rc}" if rc is not None else "worker stopped answering"

    def dead_error(self, why: str) -> EngineDeadError:
        return EngineDeadError(f"{self.role} worker {self.index} (pid {self.pid}) {why}: {self.error_text()}")

    async def wait_ready(self, timeout: float) -> pr.Ready:
        """HELLO and READY within the deadline, watching the process: a crash during start-up
        surfaces with the worker's own error."""
        exited = asyncio.ensure_future(self.proc.wait())
        try:
            done, _ = await asyncio.wait(
                {self.ready_future, exited}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if self.ready_future in done:
                return self.ready_future.result()
            if exited in done:
                await asyncio.sleep(0.05)  # let a Fatal message that raced the exit arrive
                raise RuntimeError(f"{self.role} worker {self.index} failed to start: {self.error_text()}")
            raise TimeoutError(f"{self.role} worker {self.index} not ready within {timeout} s: {self.error_text()}")
        finally:
            exited.cancel()

    async def stop(self, graceful_s: float = 5.0) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            try:
                await asyncio.wait_for(self.proc.wait(), graceful_s)
            except TimeoutError:
                self.kill()
                await self.proc.wait()
        self._log.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
