"""What rlt.Engine.launch returns: await it, or use it with `async with`."""

import asyncio
import gc


class Launch:
    """`async with Engine.launch(...) as engine` or `engine = await Engine.launch(...)`."""

    def __init__(self, engine):  # an rlt.Engine, not yet started
        self.engine = engine

    def __await__(self):
        return self._start().__await__()

    async def _start(self):
        # The tokenizer (transformers' import, the tokenizer.json parse: ~1 s of CPU) loads in a
        # thread while the workers start, and the caller's loop keeps running. A tokenizer that does
        # not load fails the launch once the workers are up, and they are stopped. The heap is
        # frozen before and after (as vLLM's server does): a full collection then scans only
        # objects made since, instead of stalling the loop for the whole heap (~100 ms with torch
        # loaded) at random moments.
        engine = self.engine
        engine._admission.loop = asyncio.get_running_loop()
        gc.freeze()
        tokenizer = asyncio.ensure_future(asyncio.to_thread(engine.load_tokenizer))
        try:
            await engine._supervisor.start()
        except BaseException:
            await asyncio.gather(tokenizer, return_exceptions=True)
            raise
        try:
            await tokenizer
        except BaseException:
            await engine.shutdown()
            raise
        gc.freeze()
        return engine

    async def __aenter__(self):
        return await self._start()

    async def __aexit__(self, *exc) -> None:
        await self.engine.shutdown()
