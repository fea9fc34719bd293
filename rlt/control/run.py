"""Running a command's coroutine (rlt generate, scripts/launch_1p1d.py): on uvloop when installed,
with SIGTERM and SIGHUP handled as SIGINT is: the main task is cancelled, so the engine shuts down on
the way out (no worker, no temp dir left), then KeyboardInterrupt."""

import asyncio
import signal


def run_command(coro):
    stopped = []

    async def main():
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, lambda s=sig: (stopped.append(s), task.cancel()))
        return await coro

    try:
        try:
            import uvloop

            return uvloop.run(main())
        except ImportError:
            return asyncio.run(main())
    except asyncio.CancelledError:
        if stopped:
            raise KeyboardInterrupt(signal.Signals(stopped[0]).name) from None
        raise
