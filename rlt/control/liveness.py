"""The Supervisor's watch over its workers: an exit, heartbeats that stop, a main loop stuck with
work; a dead worker fails only its requests, and its slot is restarted with backoff while the
topology still allows it."""

import asyncio
import logging
import time

from rlt.control.worker_proc import WorkerProc

log = logging.getLogger("rlt")
RESTART_BACKOFF_S, RESTART_BACKOFF_MAX_S = 0.5, 30.0


class Liveness:
    """The Supervisor's liveness and restart half (its workers, slots, lifecycle, launch)."""

    def unhealthy(self, w) -> str | None:
        """Why a READY worker cannot serve now (None: it can): silent for four heartbeats (stopped,
        say; a busy host delays them a little), its main loop stuck with work, or its own trouble."""
        if not isinstance(w, WorkerProc):
            return None  # (a remote proxy's liveness is its own)
        now, late = time.monotonic(), max(2.0, 4 * self.launch.heartbeat_interval)
        if now - w.last_seen > late:
            return f"{w.identity} sent no heartbeat for {now - w.last_seen:.1f} s"
        if w.busy and now - w.progress_at > late:
            return (
                f"{w.identity}'s main loop has not moved for {now - w.progress_at:.1f} s with work"
            )
        return None if w.trouble is None else f"{w.identity}: {w.trouble}"

    async def _watch_exit(self, w: WorkerProc) -> None:
        await w.wait()
        if not self.closing and self.workers[w.slot] is w:
            await asyncio.sleep(0.05)  # a Fatal message racing the exit carries the real cause
            await self._worker_dead(w)

    async def _heartbeat_watch(self) -> None:
        limit = self.launch.heartbeat_timeout
        # a heartbeat this recent: still beating
        beating = max(limit / 2, 2 * self.launch.heartbeat_interval)
        tick = time.monotonic()
        while True:
            await asyncio.sleep(self.launch.heartbeat_interval)
            now = time.monotonic()
            late, tick = now - tick - self.launch.heartbeat_interval, now
            if late > beating / 2:  # the caller's loop was held up: heartbeats sent meanwhile are
                continue  # still unread; judge on the next tick, once the receive loop has run
            for w in self.workers:
                if not isinstance(w, WorkerProc) or w.ready is None or self.closing or not w.alive:
                    continue  # (a remote proxy's liveness is its own)
                # killed, so a hung process cannot come back half-alive
                if now - w.last_seen > limit:
                    w.kill(
                        f"was killed after no heartbeat for {now - w.last_seen:.1f} s (deadline {limit} s)"
                    )
                elif w.busy and now - w.progress_at > limit and now - w.last_seen < beating:
                    # (its heartbeats still arrive: the main loop, not the whole process, is stuck)
                    w.kill(
                        f"was killed: main loop stuck for {now - w.progress_at:.1f} s with work (deadline {limit} s)"
                    )

    async def _worker_dead(self, w: WorkerProc) -> None:
        err = w.dead_error()
        self.dead_reason = str(err)
        if not self.closing:
            log.warning(
                "%s%d %s%s",
                *self.slots[w.slot],
                err,
                "; restarting it" if self.launch.restart else "",
            )
        self.lifecycle.on_worker_dead(w, err)
        if self.cache_relay is not None:
            self.cache_relay.forget("{}{}".format(*self.slots[w.slot]))
        await self._remove(w)
        if self.launch.restart and not self.closing:
            await self._restart(w.slot, err)
        if not self.closing and not self.gave_up.is_set():
            missing = [
                role
                for role, _ in self.local_slots
                if not self.ready(role) and not self._restarting(role)
            ]
            if missing:  # (e.g. restarts ran out, or restart is off): the engine cannot serve
                self.dead_reason = f"no {missing[0]} worker and no restart left: {self.dead_reason}"
                log.error("%s", self.dead_reason)
                self.gave_up.set()
        self.on_worker_ready()

    def _restarting(self, role: str) -> bool:
        return any(self.slots[slot][0] == role for slot in self.restarting)

    async def _remove(self, w: WorkerProc) -> None:
        """Forget a dead (or failed) worker: its slot, its messages, its process."""
        self.workers[w.slot] = None
        self._by_identity.pop(w.identity, None)
        if w.sender is not None:
            w.sender.cancel()
        w.kill()
        await w.stop(0)

    async def _restart(self, slot: int, err: Exception) -> None:
        """Start the slot's worker again, retrying with exponential backoff (from RESTART_BACKOFF_S,
        capped at RESTART_BACKOFF_MAX_S) up to restart_attempts times: a cause that goes away
        (a checkpoint briefly unreadable, a device briefly busy) does not leave the engine dead."""
        delay = RESTART_BACKOFF_S
        for attempt in range(1, self.launch.restart_attempts + 1):
            self.restarting[slot] = attempt
            try:
                new = await self._start_worker(slot)
                await self._introduce_peers(new)
                self.dead_reason = None
                del self.restarting[slot]
                log.warning(
                    "%s%d restarted (pid %s, attempt %d)", *self.slots[slot], new.pid, attempt
                )
                return
            except Exception as e:  # noqa: BLE001
                if self.workers[slot] is not None:
                    await self._remove(self.workers[slot])
                self.dead_reason = f"{err}; restart attempt {attempt} of {self.launch.restart_attempts} failed: {e}"
                log.warning("%s", self.dead_reason)
            if self.closing:
                break
            await asyncio.sleep(delay)
            delay = min(2 * delay, RESTART_BACKOFF_MAX_S)
        self.restarting.pop(slot, None)
