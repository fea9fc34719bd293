"""rlt.Engine: the coordinator, running in the caller's event loop.

It owns the ModelConfig and every request's state, validates requests before any worker sees them,
talks to worker subprocesses over ZeroMQ (ROUTER here, a DEALER per worker) with msgspec messages,
and streams outputs into per-request collectors. It never blocks the event loop and imports no
torch.
"""

import asyncio
import dataclasses
import itertools
import os
import shutil
import tempfile
import time
import uuid

import zmq
import zmq.asyncio

from rlt.config import ModelConfig
from rlt.control import from_worker as fw
from rlt.control import to_worker as tw
from rlt.control.collector import Collector
from rlt.control.validation import resolve_params, validate_prompt
from rlt.control.worker_proc import WorkerProc
from rlt.errors import EngineDeadError, RequestError
from rlt.outputs import RequestOutput
from rlt.sampling_params import SamplingParams

ENGINE_OPTIONS = ("kv_layout", "block_size", "num_blocks", "kv_memory_bytes", "max_num_seqs", "prefill_chunk",
                  "max_num_batched_tokens")
COORDINATOR_OPTIONS = {"startup_timeout": 300.0, "heartbeat_interval": 0.5, "heartbeat_timeout": 10.0,
                       "restart": True}
TOPOLOGIES = ("single",)


@dataclasses.dataclass
class _Live:
    request_id: str
    gen: int
    collector: Collector
    worker: WorkerProc


class _Launch:
    """`async with Engine.launch(...) as engine` or `engine = await Engine.launch(...)`."""

    def __init__(self, engine: "Engine"):
        self.engine = engine

    def __await__(self):
        return self._start().__await__()

    async def _start(self) -> "Engine":
        await self.engine._start()
        return self.engine

    async def __aenter__(self) -> "Engine":
        return await self._start()

    async def __aexit__(self, *exc) -> None:
        await self.engine.shutdown()


class Engine:
    def __init__(self, mc: ModelConfig, *, topology: str, device: str, dtype: str | None, engine_options: dict,
                 options: dict):
        self.model_config, self.topology, self.device, self.dtype = mc, topology, device, dtype
        self._engine_options, self._opt = engine_options, options
        from rlt.models.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer(mc.path)
        self._live: dict[str, _Live] = {}
        self._by_gen: dict[int, _Live] = {}
        self._gens = itertools.count(1)
        self._incarnations = itertools.count()
        self._workers: list[WorkerProc | None] = [None]
        self._by_identity: dict[str, WorkerProc] = {}
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
        self._dead_reason: str | None = None

    # ---- launch / shutdown ------------------------------------------------------------------------
    @classmethod
    def launch(cls, model: str | None = None, *, topology: str = "single", device: str = "cpu",
               dtype: str | None = None, hf_overrides: dict | None = None, **options) -> _Launch:
        """Build the ModelConfig and check every option before any process is spawned."""
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology {topology!r} is not supported (supported: {', '.join(TOPOLOGIES)})")
        if dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype {dtype!r} is not supported (float32, bfloat16, float16)")
        if not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
            raise ValueError(f"device {device!r} is not supported (cpu, cuda, cuda:N)")
        unknown = set(options) - set(ENGINE_OPTIONS) - set(COORDINATOR_OPTIONS)
        if unknown:
            raise ValueError(f"unknown option {sorted(unknown)[0]!r} (known: "
                             f"{', '.join(ENGINE_OPTIONS + tuple(COORDINATOR_OPTIONS))})")
        if options.get("kv_layout", "last_exited") not in ("last_exited", "shared"):
            raise ValueError(f"kv_layout {options['kv_layout']!r} is not supported (last_exited, shared)")
        for name in ("block_size", "num_blocks", "max_num_seqs", "prefill_chunk", "max_num_batched_tokens"):
            v = options.get(name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if model is None:
            from rlt.default_model import default_model_path

            model = default_model_path()
        mc = ModelConfig.from_pretrained(model, hf_overrides=hf_overrides)
        engine_options = {k: v for k, v in options.items() if k in ENGINE_OPTIONS}
        opts = {k: options.get(k, v) for k, v in COORDINATOR_OPTIONS.items()}
        return _Launch(cls(mc, topology=topology, device=device, dtype=dtype, engine_options=engine_options,
                           options=opts))

    async def _start(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="rlt-")
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unroutable send raises, never drops silently
        self._sock.setsockopt(zmq.LINGER, 0)
        self._addr = f"ipc://{self._dir}/control"
        self._sock.bind(self._addr)
        self._spawn(self._recv_loop())
        self._spawn(self._heartbeat_watch())
        try:
            await self._start_worker(0)
        except BaseException:
            await self.shutdown()
            raise

    async def _start_worker(self, index: int) -> WorkerProc:
        w = WorkerProc(index, "unified", next(self._incarnations), self._addr, self._dir)
        self._by_identity[w.identity] = w
        self._workers[index] = w
        await w.spawn(handshake_timeout=self._opt["startup_timeout"])
        await w.wait_ready(self._opt["startup_timeout"])
        w.last_seen = time.monotonic()
        self._spawn(self._watch_exit(w))
        return w

    async def shutdown(self) -> None:
        """Stop every worker, fail what is still live, close sockets. Idempotent."""
        if self._closing:
            return
        self._closing = True
        for w in self._workers:
            if w is not None and w.proc is not None and w.proc.returncode is None:
                await self._send(w, tw.Shutdown())
        for w in self._workers:
            if w is not None:
                await w.stop()
        for live in list(self._live.values()):
            live.collector.fail(EngineDeadError("the engine was shut down"))
        self._live.clear()
        self._by_gen.clear()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._sock.close(0)
        self._ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # ---- worker traffic ---------------------------------------------------------------------------
    async def _send(self, w: WorkerProc, msg) -> bool:
        try:
            await self._sock.send_multipart([w.identity.encode(), tw.encoder.encode(msg)])
            return True
        except zmq.ZMQError:  # unroutable: the worker is gone; its death handler reports it
            return False

    async def _recv_loop(self) -> None:
        while True:
            identity, payload = await self._sock.recv_multipart()
            w = self._by_identity.get(identity.decode().split("/")[0])
            if w is None:
                continue  # an earlier incarnation: drop
            w.last_seen = time.monotonic()
            try:
                await self._dispatch(w, fw.decoder.decode(payload))
            except Exception as e:  # noqa: BLE001 - one bad message must not stop the receiver
                import logging

                logging.getLogger("rlt").exception("dropped a message from %s: %s", w.identity, e)

    async def _dispatch(self, w: WorkerProc, msg) -> None:
        if isinstance(msg, fw.Outputs):
            self._on_outputs(w, msg)
        elif isinstance(msg, fw.Hello):
            await self._send(w, tw.Handshake(
                model_path=self.model_config.path, config=self.model_config.raw, dtype=self.dtype,
                device=self.device, role=w.role, engine=self._engine_options,
                heartbeat_interval=self._opt["heartbeat_interval"]))
        elif isinstance(msg, fw.Ready):
            w.ready, w.stats = msg, fw.Stats(0, 0, msg.kv_blocks_total)
            if not w.ready_future.done():
                w.ready_future.set_result(msg)
        elif isinstance(msg, fw.Failed):
            live = self._by_gen.get(msg.gen)
            if live is not None:
                self._retire(live)
                live.collector.finish("error", msg.error)
        elif isinstance(msg, fw.Fatal):
            w.fatal = msg.error

    def _on_outputs(self, w: WorkerProc, msg: fw.Outputs) -> None:
        w.stats = msg.stats
        for t in msg.tokens:
            live = self._by_gen.get(t.gen)
            if live is None:
                continue  # a retired generation (aborted or finished): drop
            if t.finish is not None:
                self._retire(live)
            live.collector.push(t.token, t.depth, t.logprobs, t.finish)

    async def _watch_exit(self, w: WorkerProc) -> None:
        rc = await w.proc.wait()
        if not self._closing and self._workers[w.index] is w:
            await asyncio.sleep(0.05)  # a Fatal message racing the exit carries the real cause
            await self._worker_dead(w, f"died (exit code {rc})")

    async def _heartbeat_watch(self) -> None:
        while True:
            await asyncio.sleep(self._opt["heartbeat_interval"])
            for w in self._workers:
                if w is None or w.ready is None or self._closing:
                    continue
                silent = time.monotonic() - w.last_seen
                if silent > self._opt["heartbeat_timeout"] and w.proc.returncode is None:
                    w.fatal = w.fatal or f"no heartbeat for {silent:.1f} s (deadline {self._opt['heartbeat_timeout']} s)"
                    w.kill()  # a hung process is killed so it cannot come back half-alive

    async def _worker_dead(self, w: WorkerProc, why: str) -> None:
        err = w.dead_error(why)
        self._dead_reason = str(err)
        self._workers[w.index] = None
        self._by_identity.pop(w.identity, None)
        for live in [lv for lv in self._live.values() if lv.worker is w]:
            self._retire(live)
            live.collector.fail(err)
        await w.stop(0)
        if self._opt["restart"] and not self._closing:
            try:
                await self._start_worker(w.index)
                self._dead_reason = None
            except Exception as e:  # noqa: BLE001
                self._dead_reason = f"{err}; restart failed: {e}"

    # ---- public API -------------------------------------------------------------------------------
    def _retire(self, live: _Live) -> None:
        """The request is no longer live: its id may be reused at once; late messages are dropped."""
        self._live.pop(live.request_id, None)
        self._by_gen.pop(live.gen, None)

    def _worker_for_new_request(self) -> WorkerProc:
        w = self._workers[0]
        if self._closing:
            raise EngineDeadError("the engine was shut down")
        if w is None or w.ready is None:
            raise EngineDeadError(self._dead_reason or "no worker is ready")
        return w

    def _tokenize(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError(f"{self.model_config.path} has no tokenizer.json: give token ids, not text")
            prompt = self.tokenizer(prompt).input_ids
        return validate_prompt(self.model_config, prompt)

    def generate(self, prompt: str | list[int], params: SamplingParams | None = None,
                 request_id: str | None = None, priority: int = 0):
        """Async iterator of cumulative RequestOutputs; the last has finished=True. The request is
        validated (RequestError) and submitted at the call; cancelling the consuming task or closing
        the iterator aborts it."""
        live = self._admit(prompt, params if params is not None else SamplingParams(), request_id, priority)
        return self._stream(live)

    def _admit(self, prompt, params, request_id, priority) -> _Live:
        ids = self._tokenize(prompt)
        p = resolve_params(self.model_config, len(ids), params)
        if request_id is None:
            request_id = uuid.uuid4().hex
        elif not isinstance(request_id, str) or not request_id:
            raise RequestError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self._live:
            raise RequestError(f"request_id {request_id!r} is already live")
        w = self._worker_for_new_request()
        r = w.ready
        need = r.kv_planes * -(-(len(ids) + p.max_tokens) // r.block_size)
        if need > r.kv_blocks_total:
            raise RequestError(f"prompt {len(ids)} + max_tokens {p.max_tokens} needs {need} KV blocks, "
                               f"the worker has {r.kv_blocks_total}: it can never fit")
        gen = next(self._gens)
        out = RequestOutput(request_id, ids, logprobs=[] if p.logprobs else None)
        live = _Live(request_id, gen, Collector(out, gen), w)
        self._live[request_id] = live
        self._by_gen[gen] = live
        self._spawn(self._send(w, tw.Add(gen=gen, prompt=ids, params=p, priority=priority)))
        return live

    async def _stream(self, live: _Live):
        try:
            while True:
                out = await live.collector.get()
                if self.tokenizer is not None:
                    out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
                yield out
                if out.finished:
                    return
        finally:
            if self._by_gen.get(live.gen) is live:  # cancelled or closed mid-stream
                self._abort(live)

    def _abort(self, live: _Live) -> None:
        self._retire(live)
        live.collector.finish("abort")
        if live.worker.proc is not None and live.worker.proc.returncode is None:
            self._spawn(self._send(live.worker, tw.Abort([live.gen])))

    async def abort(self, request_id: str) -> bool:
        """End the request's stream with finish_reason 'abort'. Idempotent: False if not live."""
        live = self._live.get(request_id)
        if live is None:
            return False
        self._abort(live)
        return True

    def stats(self) -> dict:
        workers = []
        for w in self._workers:
            if w is None:
                continue
            r, s = w.ready, w.stats
            workers.append({"role": w.role, "pid": w.pid, "kv_blocks_total": r.kv_blocks_total if r else 0,
                            "kv_blocks_free": s.kv_blocks_free, "running": s.running, "waiting": s.waiting})
        return {"live_requests": len(self._live), "workers": workers}
