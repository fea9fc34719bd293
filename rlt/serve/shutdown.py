"""uvicorn's server with rlt's shutdown. SIGTERM, SIGINT or SIGHUP stops accepting, lets requests in flight
finish for --shutdown-timeout seconds, then fails those left (a stream gets an error event, a whole
response a 503) and stops the engine; any second signal (uvicorn: only SIGINT) stops at once, and
the engine stops even then (uvicorn skips the app's shutdown on a forced exit): no worker or temp
dir outlives the server. A server whose engine can no longer serve (a worker that will not be
restarted) stops and exits with status 1, as vLLM's does."""

import asyncio
import contextlib
import logging
import signal
import sys
import threading

import uvicorn

log = logging.getLogger("rlt")


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine, shutdown_timeout: float, ready_line: str):
        super().__init__(config)
        self.engine, self.shutdown_timeout, self.ready_line, self.exit_code = (
            engine,
            shutdown_timeout,
            ready_line,
            0,
        )
        self._deadline: asyncio.Task | None = None  # fails what is left after shutdown_timeout
        # the ready line, then exits when the engine cannot serve
        self._watch: asyncio.Task | None = None

    async def startup(self, sockets=None) -> None:
        """(The app's start-up begins the engine's launch; uvicorn then accepts on the socket rlt serve
        bound and listened on before anything loaded, answering 503 until every worker is READY: the
        ready line comes then. A launch that fails ends the server with its error, status 1.)"""
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self._watch = asyncio.ensure_future(self._serve_while_able(self.config.app.state.start))

    async def _serve_while_able(self, start: asyncio.Future) -> None:
        try:
            await asyncio.shield(start)
        except Exception as e:  # noqa: BLE001 - the launch's error is the server's
            print(f"rlt: error: {e}", file=sys.stderr, flush=True)
            self.exit_code, self.should_exit = 1, True
            return
        print(self.ready_line, flush=True)
        await self._exit_when_failed()

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn's (SIGINT, SIGTERM), and SIGHUP (a closed terminal) the same way."""
        with super().capture_signals():
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = signal.signal(signal.SIGHUP, self.handle_exit)
            try:
                yield
            finally:
                signal.signal(signal.SIGHUP, previous)

    def handle_exit(self, sig, frame) -> None:
        if self.should_exit:
            self.force_exit = True
        super().handle_exit(sig, frame)
        if self._deadline is None:
            loop = asyncio.get_running_loop()
            self._deadline = loop.create_task(self._fail_late())

    async def _fail_late(self) -> None:
        await asyncio.sleep(self.shutdown_timeout)
        left = self.engine.stats().live_requests
        if left:
            log.warning(
                "rlt serve: %d request(s) still running after --shutdown-timeout %s s: failed",
                left,
                self.shutdown_timeout,
            )
        await self.engine.shutdown()  # every stream left gets its error

    async def _exit_when_failed(self) -> None:
        reason = await self.engine.wait_failed()
        log.error("rlt serve: the engine cannot serve any more, exiting: %s", reason)
        self.exit_code = 1
        self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        await super().shutdown(sockets)
        for task in (self._deadline, self._watch):
            if task is not None:
                task.cancel()
        await self.engine.shutdown()
