"""rlt.Engine: the coordinator, running in the caller's event loop.

It owns the ModelConfig and every request's state (rlt/control/lifecycle.py), validates requests
before any worker sees them, routes them to workers (least loaded by credits), talks to worker
subprocesses over ZeroMQ (ROUTER here, a DEALER per worker) with msgspec messages, and streams
outputs into per-request collectors. It never blocks the event loop and imports no torch.
"""

import asyncio
import itertools
import logging
import re
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
from rlt.control.lifecycle import Holding, Phase, Request
from rlt.control.validation import resolve_params, validate_prompt
from rlt.control.worker_proc import WorkerProc
from rlt.errors import EngineDeadError, RequestError
from rlt.outputs import RequestOutput
from rlt.sampling_params import SamplingParams
from rlt.workers.engine_config import EngineConfig

log = logging.getLogger("rlt")

ENGINE_OPTIONS = ("kv_layout", "block_size", "num_blocks", "kv_memory_bytes", "max_num_seqs", "prefill_chunk",
                  "max_num_batched_tokens", "batch_invariant", "cuda_graph_max_batch", "steady_decode")
COORDINATOR_OPTIONS = {"startup_timeout": 300.0, "heartbeat_interval": 0.5, "heartbeat_timeout": 10.0,
                       "restart": True, "transfer_timeout": 30.0,
                       # XpYd, conditional disaggregation: the decode worker prefills a prompt itself
                       # (no KV handoff) when it is at most this long, or when the prefill worker
                       # already holds this many requests (None: never)
                       "max_local_prefill_length": 0, "max_prefill_queue_size": None,
                       # XpYd: prefill workers take prompts in chunks of this many rows, in passes of
                       # at least as many: no decode shares their passes, so only memory bounds a
                       # chunk (None: prefill_chunk, as every worker)
                       "prefill_worker_chunk": None}


def parse_topology(topology: str) -> list[tuple[str, int]]:
    """The worker slots: 'single' -> one unified worker; 'Nx' -> N unified replicas (requests go
    to the least loaded); 'XpYd' -> X prefill and Y decode workers."""
    if topology == "single":
        return [("unified", 0)]
    m = re.fullmatch(r"([1-9]\d*)x", topology)
    if m is not None:
        return [("unified", i) for i in range(int(m.group(1)))]
    m = re.fullmatch(r"([1-9]\d*)p([1-9]\d*)d", topology)
    if m is None:
        raise ValueError(f"topology {topology!r} is not supported (single, Nx replicas such as 2x, or XpYd "
                         "such as 1p1d)")
    return [("prefill", i) for i in range(int(m.group(1)))] + [("decode", i) for i in range(int(m.group(2)))]


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
        self._slots = parse_topology(topology)
        self._workers: list[WorkerProc | None] = [None] * len(self._slots)
        self._by_identity: dict[str, WorkerProc] = {}
        self._live: dict[str, Request] = {}  # user-visible requests, by request id
        self._gens: dict[int, Request] = {}  # every request still holding resources, by generation
        self._gen_ids = itertools.count(1)
        self._incarnations = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
        self._fingerprint: str | None = None
        self._dead_reason: str | None = None
        self._local_prefills = 0  # PD requests the decode worker prefilled itself
        self._kv_chunks = 0  # PD KV writes handed off (one per prompt chunk on a prefill worker)

    # ---- launch / shutdown ------------------------------------------------------------------------
    @classmethod
    def launch(cls, model: str | None = None, *, topology: str = "single", device: str = "cpu",
               dtype: str | None = None, hf_overrides: dict | None = None, **options) -> _Launch:
        """Build the ModelConfig and check every option before any process is spawned."""
        parse_topology(topology)
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
            if name not in options or (name == "num_blocks" and options[name] is None):  # None: from kv_memory_bytes
                continue
            v = options[name]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        for name in ("batch_invariant", "steady_decode"):
            if name in options and not isinstance(options[name], bool):
                raise ValueError(f"{name} must be True or False, got {options[name]!r}")
        for name, low in (("max_local_prefill_length", 0), ("max_prefill_queue_size", 0), ("prefill_worker_chunk", 1)):
            v = options.get(name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
            if parse_topology(topology)[0][0] != "prefill":
                raise ValueError(f"{name} applies to prefill/decode topologies (XpYd), not {topology!r}")
        if model is None:
            from rlt.default_model import default_model_path

            model = default_model_path()
        mc = ModelConfig.from_pretrained(model, hf_overrides=hf_overrides)
        engine_options = {k: v for k, v in options.items() if k in ENGINE_OPTIONS}
        opts = {k: options.get(k, v) for k, v in COORDINATOR_OPTIONS.items()}
        return _Launch(cls(mc, topology=topology, device=device, dtype=dtype, engine_options=engine_options,
                           options=opts))

    def _engine_options_for(self, role: str) -> dict:
        chunk = self._opt["prefill_worker_chunk"]
        if role != "prefill" or chunk is None:
            return self._engine_options
        rows = max(chunk, self._engine_options.get("max_num_batched_tokens", EngineConfig.max_num_batched_tokens))
        return {**self._engine_options, "prefill_chunk": chunk, "max_num_batched_tokens": rows}

    def _device_for(self, slot: int) -> str:
        """One device per worker on GPU (cuda:0, cuda:1, ... in slot order); all on CPU otherwise."""
        if self.device == "cpu" or (len(self._slots) == 1 and self.device != "cuda"):
            return self.device
        return f"cuda:{slot}"

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
            await asyncio.gather(*(self._start_worker(i) for i in range(len(self._slots))))
            self._check_fingerprints()
            await self._introduce_peers(None)
        except BaseException:
            await self.shutdown()
            raise

    async def _start_worker(self, slot: int) -> WorkerProc:
        role, index = self._slots[slot]
        w = WorkerProc(index, role, next(self._incarnations), self._addr, self._dir)
        w.slot, w.device = slot, self._device_for(slot)
        self._by_identity[w.identity] = w
        self._workers[slot] = w
        await w.spawn(handshake_timeout=self._opt["startup_timeout"])
        ready = await w.wait_ready(self._opt["startup_timeout"])
        if self._fingerprint is not None and ready.fingerprint != self._fingerprint:  # a restart
            w.kill()
            raise RuntimeError(f"restarted {role} worker {index} has fingerprint {ready.fingerprint}, the others "
                               f"{self._fingerprint}: config, weights, dtype or KV layout differ")
        w.last_seen = time.monotonic()
        self._spawn(self._watch_exit(w))
        w.sender = self._spawn(self._sender(w))
        return w

    def _check_fingerprints(self) -> None:
        """Every worker must hash config + weights + dtype + KV layout identically; name who differs
        from the most common fingerprint (ties: the first worker's)."""
        fps = [w.ready.fingerprint for w in self._workers]
        ref = max(fps, key=lambda f: (fps.count(f), -fps.index(f)))
        odd = [w for w in self._workers if w.ready.fingerprint != ref]
        if odd:
            first = next(w for w in self._workers if w.ready.fingerprint == ref)
            names = ", ".join(f"{w.role} worker {w.index} (fingerprint {w.ready.fingerprint})" for w in odd)
            raise RuntimeError(f"{names} differs from {first.role} worker {first.index} (fingerprint {ref}): "
                               "config, weights, dtype or KV layout differ")
        self._fingerprint = ref

    async def _introduce_peers(self, new: WorkerProc | None) -> None:
        """Prefill workers learn the decode workers' agents (all of them, or the one restarted)."""
        decodes = [w for w in self._workers if w is not None and w.role == "decode" and w.ready]
        for w in self._workers:
            if w is None or w.role != "prefill" or not w.ready:
                continue
            peers = decodes if new is None or new is w else [new] if new.role == "decode" else []
            if peers:
                await self._send(w, tw.Connect([d.ready.transport for d in peers]))

    async def shutdown(self) -> None:
        """Stop every worker, fail what is still live, close sockets. Idempotent."""
        if self._closing:
            return
        self._closing = True
        for w in self._workers:
            if w is not None and w.proc is not None and w.proc.returncode is None:
                while not w.outbox.empty():  # what is queued (aborts) goes first
                    await self._send(w, w.outbox.get_nowait())
                await self._send(w, tw.Shutdown())
        await asyncio.gather(*(w.stop() for w in self._workers if w is not None))
        for r in list(self._live.values()):
            r.collector.fail(EngineDeadError("the engine was shut down"))
        self._live.clear()
        self._gens.clear()
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

    def _post(self, w: WorkerProc | None, msg) -> None:
        """Queue a message for a worker without waiting; messages to one worker keep their order
        (Reserve before Abort, Prefill before Cancel)."""
        if w is not None and w.proc is not None and w.proc.returncode is None:
            w.outbox.put_nowait(msg)

    async def _sender(self, w: WorkerProc) -> None:
        while True:
            msg = await w.outbox.get()
            await self._send(w, msg)

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
                log.exception("dropped a message from %s: %s", w.identity, e)

    async def _dispatch(self, w: WorkerProc, msg) -> None:
        if isinstance(msg, fw.Outputs):
            w.stats = msg.stats
            for gen in msg.started:
                r = self._gens.get(gen)
                if r is not None and r.phase == Phase.RESERVED:
                    r.phase = Phase.PREFILLING
            for t in msg.tokens:
                self._on_token(w, t)
        elif isinstance(msg, fw.Hello):
            await self._send(w, tw.Handshake(
                model_path=self.model_config.path, config=self.model_config.raw, dtype=self.dtype,
                device=w.device, role=w.role, engine=self._engine_options_for(w.role),
                heartbeat_interval=self._opt["heartbeat_interval"], transfer_timeout=self._opt["transfer_timeout"]))
        elif isinstance(msg, fw.Ready):
            w.ready, w.stats = msg, fw.Stats(0, 0, msg.kv_blocks_total)
            if not w.ready_future.done():
                w.ready_future.set_result(msg)
        elif isinstance(msg, fw.Reserved):
            self._on_reserved(w, msg)
        elif isinstance(msg, fw.TransferDone):
            self._on_prefill_released(msg.gen, w, chunks=msg.chunks)
        elif isinstance(msg, fw.Drained):
            self._on_prefill_released(msg.gen, w, chunks=None)
        elif isinstance(msg, fw.Failed):
            self._on_failed(w, msg)
        elif isinstance(msg, fw.Heartbeat):
            if msg.progress != w.progress or not msg.busy:
                w.progress, w.progress_at = msg.progress, time.monotonic()
            w.busy = msg.busy
        elif isinstance(msg, fw.Fatal):
            w.fatal = msg.error

    # ---- request events ---------------------------------------------------------------------------
    def _retire(self, r: Request) -> None:
        """Gone from the user's view: the id may be reused at once; late outputs are dropped."""
        r.retired = True
        if self._live.get(r.request_id) is r:
            del self._live[r.request_id]

    def _forget(self, r: Request) -> None:
        self._retire(r)
        self._gens.pop(r.gen, None)

    def _release_decode(self, r: Request) -> None:
        """Free the decode (or unified) worker's side: only once no write into it can land."""
        if r.decode is not None and not r.decode.released:
            r.decode.release()
            self._post(r.decode.worker, tw.Abort([r.gen]))
        if r.prefill is None or r.prefill.released:
            self._forget(r)

    def _on_token(self, w: WorkerProc, t: fw.Token) -> None:
        r = self._gens.get(t.gen)
        if r is None or r.retired:
            return  # a retired generation: drop
        if r.prefill is not None and w is r.prefill.worker:  # the first token, from the prefill worker
            r.first_token = t.token
            r.phase = Phase.TRANSFERRING
        r.collector.push(t.token, t.depth, t.logprobs, t.finish)
        if t.finish is not None:
            self._retire(r)
            if w is r.decode.worker:  # the decode side finished and freed its blocks itself
                r.decode.release()
                if r.prefill is None or r.prefill.released:
                    self._forget(r)
            # finished on the prefill worker's first token: the decode side is freed after TransferDone

    def _on_reserved(self, d: WorkerProc, msg: fw.Reserved) -> None:
        r = self._gens.get(msg.gen)
        if r is None or r.retired or r.decode is None or r.decode.worker is not d:
            self._post(d, tw.Abort([msg.gen]))  # aborted while reserving: no writer was ever told
            if r is not None and r.decode is not None and r.decode.worker is d:
                r.decode.release()
                self._forget(r)
            return
        p = r.prefill.worker
        r.phase = Phase.RESERVED
        self._post(p, tw.Prefill(gen=r.gen, prompt=r.prompt, params=r.params, priority=r.priority,
                                 dst_agent=d.ready.transport.agent_name, dst_tables=msg.tables))

    def _on_prefill_released(self, gen: int, p: WorkerProc, chunks: int | None) -> None:
        """TransferDone (`chunks` written, P's blocks free) or Drained (cancelled, nothing in flight)."""
        r = self._gens.get(gen)
        if r is None or r.prefill is None or r.prefill.worker is not p:
            return
        r.prefill.release()
        if chunks is not None:
            self._kv_chunks += chunks
        if chunks is not None and not r.retired:
            r.phase = Phase.DECODING
            self._post(r.decode.worker, tw.Activate(gen=gen, prompt=r.prompt, params=r.params, priority=r.priority,
                                                    first_token=r.first_token, chunks=chunks))
        else:
            self._release_decode(r)

    def _on_failed(self, w: WorkerProc, msg: fw.Failed) -> None:
        r = self._gens.get(msg.gen)
        if r is None:
            return
        if not r.retired:
            r.collector.finish("error", msg.error)
            self._retire(r)
        if r.prefill is not None and w is r.prefill.worker:  # P drained and freed before reporting
            r.prefill.release()
            self._release_decode(r)
        elif r.decode is not None and w is r.decode.worker:  # D freed its side before reporting
            r.decode.release()
            if r.prefill is not None and not r.prefill.released:
                self._post(r.prefill.worker, tw.Cancel(r.gen))  # Drained will finish the cleanup
            else:
                self._forget(r)

    def _cancel(self, r: Request) -> None:
        """User abort / cancellation, at whatever phase the request is in."""
        self._retire(r)
        r.collector.finish("abort")
        if r.prefill is None or r.prefill.released:  # single, or PD after the handoff
            self._release_decode(r)
        elif r.phase == Phase.WAITING:  # P not told yet: D drops a queued or granted reservation
            r.prefill.release()
            self._release_decode(r)
        else:  # P may be writing into D's blocks: P drains first, D is freed on Drained/TransferDone
            self._post(r.prefill.worker, tw.Cancel(r.gen))

    # ---- liveness ---------------------------------------------------------------------------------
    async def _watch_exit(self, w: WorkerProc) -> None:
        rc = await w.proc.wait()
        if not self._closing and self._workers[w.slot] is w:
            await asyncio.sleep(0.05)  # a Fatal message racing the exit carries the real cause
            await self._worker_dead(w, f"died (exit code {rc})")

    async def _heartbeat_watch(self) -> None:
        while True:
            await asyncio.sleep(self._opt["heartbeat_interval"])
            for w in self._workers:
                if w is None or w.ready is None or self._closing:
                    continue
                now, limit = time.monotonic(), self._opt["heartbeat_timeout"]
                if w.proc.returncode is not None:
                    continue
                if now - w.last_seen > limit:
                    w.fatal = w.fatal or f"no heartbeat for {now - w.last_seen:.1f} s (deadline {limit} s)"
                    w.kill()  # a hung process is killed so it cannot come back half-alive
                elif w.busy and now - w.progress_at > limit:
                    w.fatal = w.fatal or f"main loop stuck for {now - w.progress_at:.1f} s with work (deadline {limit} s)"
                    w.kill()

    async def _worker_dead(self, w: WorkerProc, why: str) -> None:
        err = w.dead_error(why)
        self._dead_reason = str(err)
        self._workers[w.slot] = None
        self._by_identity.pop(w.identity, None)
        for r in list(self._gens.values()):
            on_p = r.prefill is not None and r.prefill.worker is w and not r.prefill.released
            on_d = r.decode is not None and r.decode.worker is w and not r.decode.released
            if not (on_p or on_d):
                continue
            if not r.retired:
                r.collector.fail(err)
                self._retire(r)
            if on_p:  # a dead writer writes nothing more: the decode side can be freed
                r.prefill.released = True
                self._release_decode(r)
            if on_d:
                r.decode.released = True
                if r.prefill is not None and not r.prefill.released:
                    self._post(r.prefill.worker, tw.Cancel(r.gen))
                else:
                    self._forget(r)
        if w.sender is not None:
            w.sender.cancel()
        await w.stop(0)
        if self._opt["restart"] and not self._closing:
            try:
                new = await self._start_worker(w.slot)
                await self._introduce_peers(new)
                self._dead_reason = None
            except Exception as e:  # noqa: BLE001
                self._dead_reason = f"{err}; restart failed: {e}"

    # ---- public API -------------------------------------------------------------------------------
    def _pick(self, role: str) -> WorkerProc:
        """The least-loaded ready worker of a role: most free blocks after credits, then fewest slots."""
        ready = [w for w in self._workers if w is not None and w.role == role and w.ready is not None]
        if self._closing:
            raise EngineDeadError("the engine was shut down")
        if not ready:
            raise EngineDeadError(self._dead_reason or f"no {role} worker is ready")
        return max(ready, key=lambda w: (w.ready.kv_blocks_total - w.credits.blocks, -w.credits.slots))

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
        return self._stream(self._admit(prompt, params if params is not None else SamplingParams(),
                                        request_id, priority))

    @staticmethod
    def _blocks(ready: fw.Ready, positions: int) -> int:
        return ready.kv_planes * -(-positions // ready.block_size)

    def _admit(self, prompt, params, request_id, priority) -> Request:
        ids = self._tokenize(prompt)
        p = resolve_params(self.model_config, len(ids), params)
        if request_id is None:
            request_id = uuid.uuid4().hex
        elif not isinstance(request_id, str) or not request_id:
            raise RequestError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self._live:
            raise RequestError(f"request_id {request_id!r} is already live")
        pd = self._slots[0][0] != "unified"
        d = self._pick("decode" if pd else "unified")
        prefill = self._pick("prefill") if pd else None
        if prefill is not None and self._prefill_locally(len(ids), prefill):
            prefill = None
            self._local_prefills += 1
        need = self._blocks(d.ready, len(ids) + p.max_tokens)
        if need > d.ready.kv_blocks_total:
            raise RequestError(f"prompt {len(ids)} + max_tokens {p.max_tokens} needs {need} KV blocks, "
                               f"the worker has {d.ready.kv_blocks_total}: it can never fit")
        gen = next(self._gen_ids)
        out = RequestOutput(request_id, ids, logprobs=[] if p.logprobs else None)
        r = Request(request_id, gen, Collector(out), ids, p, priority)
        r.decode = Holding(d, need)
        d.credits.take(need)
        self._live[request_id] = r
        self._gens[gen] = r
        if prefill is None:
            r.phase = Phase.DECODING
            self._post(d, tw.Add(gen=gen, prompt=ids, params=p, priority=priority))
        else:
            r.prefill = Holding(prefill, self._blocks(prefill.ready, len(ids)))
            prefill.credits.take(r.prefill.blocks)
            self._post(d, tw.Reserve(gen, len(ids) + p.max_tokens))
        return r

    def _prefill_locally(self, prompt_len: int, p: WorkerProc) -> bool:
        """Conditional disaggregation: a short prompt, or a prefill worker with a queue, and the
        decode worker prefills the request as a unified worker would."""
        queue = self._opt["max_prefill_queue_size"]
        return prompt_len <= self._opt["max_local_prefill_length"] or (queue is not None and p.credits.slots >= queue)

    async def _stream(self, r: Request):
        try:
            while True:
                out = await r.collector.get()
                if self.tokenizer is not None:
                    out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
                yield out
                if out.finished:
                    return
        finally:
            if not r.retired:  # cancelled or closed mid-stream
                self._cancel(r)

    async def abort(self, request_id: str) -> bool:
        """End the request's stream with finish_reason 'abort'. Idempotent: False if not live."""
        r = self._live.get(request_id)
        if r is None:
            return False
        self._cancel(r)
        return True

    def request_phase(self, request_id: str) -> Phase | None:
        r = self._live.get(request_id)
        return r.phase if r is not None else None

    def stats(self) -> dict:
        workers = []
        for w in self._workers:
            if w is None:
                continue
            rd, s = w.ready, w.stats
            workers.append({"role": w.role, "pid": w.pid, "kv_blocks_total": rd.kv_blocks_total if rd else 0,
                            "kv_blocks_free": s.kv_blocks_free, "running": s.running, "waiting": s.waiting,
                            "credit_blocks": w.credits.blocks, "credit_slots": w.credits.slots})
        return {"live_requests": len(self._live), "pending_cleanup": len(self._gens) - len(self._live),
                "local_prefills": self._local_prefills, "kv_chunks": self._kv_chunks, "workers": workers}
