"""A request's lifecycle: the one place its states are named and every phase change is made.

Every request starts QUEUED: validated and live, waiting in the coordinator (in priority, then
arrival order) until a worker it can go to has room (rlt/control/frontend.py).
single:  QUEUED -> DECODING (the unified worker prefills and decodes) -> finished
PD:      QUEUED -> WAITING (decode worker reserving blocks) -> RESERVED (blocks granted, Prefill sent) ->
         PREFILLING (the prefill worker computes and writes each chunk into the decode worker's
         blocks) -> TRANSFERRING (first token streamed; last writes in flight) -> DECODING (the
         decode worker owns it) -> finished
PD, prefilled locally (conditional disaggregation: a short prompt, or a busy prefill worker):
         QUEUED -> DECODING on the decode worker, as single

A request leaves the user's view (its id reusable) at once on finish, abort or failure; its
resources are released in writer-before-reader order: a decode worker's reserved blocks are freed
only after the prefill worker confirmed that no write into them is in flight (TransferDone,
Drained, or its death). Credits (blocks and slots assigned to a worker) return exactly once.
"""

import heapq
import itertools
import time
from collections.abc import Callable

from rlt.contract import protocol as pr
from rlt.contract.sampling_params import ResolvedParams
from rlt.control.request import Holding, Phase, Request
from rlt.control.worker_proc import WorkerProc
from rlt.errors import EngineDeadError

__all__ = ["Holding", "Lifecycle", "Phase", "Request"]


class Lifecycle:
    """Every live request, by user id and by generation, and the transitions between phases.
    `post(worker, msg)` queues a message for a worker (in order, without waiting); `freed()` is
    called whenever a request gives a worker's slot back (queued requests may go)."""

    def __init__(self, post: Callable[[WorkerProc, object], None]):
        self.post = post
        self.freed: Callable[[], None] = lambda: None
        # (priority, gen, request): QUEUED, cancelled ones too
        self._queued: list[tuple[int, int, Request]] = []
        self.num_queued = 0  # QUEUED and not cancelled
        self.live: dict[str, Request] = {}  # user-visible requests, by request id
        self.gens: dict[int, Request] = {}  # every request still holding resources, by generation
        self._gen_ids = itertools.count(1)
        self.local_prefills = 0  # PD requests the decode worker prefilled itself
        self.kv_chunks = 0  # PD KV writes handed off (one per prompt chunk on a prefill worker)
        # PD KV handed off, and the time from Prefill to written
        self.kv_bytes, self.kv_seconds = 0, 0.0

    # ---- admission -------------------------------------------------------------------------------
    def queue(
        self, request_id: str, prompt: list[int], params: ResolvedParams, priority: int, collector
    ) -> Request:
        """A validated request, live (its id taken, its stream open) but on no worker yet."""
        r = Request(request_id, next(self._gen_ids), collector, prompt, params, priority)
        self.live[request_id] = r
        heapq.heappush(self._queued, (priority, r.gen, r))
        self.num_queued += 1
        return r

    def next_queued(self) -> Request | None:
        """The queued request to admit next: lowest priority value, then first come."""
        while self._queued and self._queued[0][2].retired:  # cancelled or failed while queued
            heapq.heappop(self._queued)
        return self._queued[0][2] if self._queued else None

    def admit(
        self,
        r: Request,
        decode: WorkerProc,
        decode_blocks: int,
        prefill: WorkerProc | None,
        prefill_blocks: int,
    ) -> None:
        """Take the credits and tell the workers: Add (single, or prefilled locally) or Reserve (PD).
        `r` is next_queued()'s."""
        heapq.heappop(self._queued)
        self.num_queued -= 1
        r.collector.out.metrics.scheduled_time = time.monotonic()
        r.decode = Holding(decode, decode_blocks)
        decode.credits.take(decode_blocks)
        self.gens[r.gen] = r
        if prefill is None:
            r.phase = Phase.DECODING
            self.post(
                decode, pr.Add(gen=r.gen, prompt=r.prompt, params=r.params, priority=r.priority)
            )
        else:
            r.phase = Phase.WAITING
            r.prefill = Holding(prefill, prefill_blocks)
            prefill.credits.take(prefill_blocks)
            self.post(decode, pr.Reserve(r.gen, len(r.prompt), r.params.max_tokens))

    def prefilled_locally(self) -> None:
        self.local_prefills += 1

    # ---- leaving ---------------------------------------------------------------------------------
    def _retire(self, r: Request) -> None:
        """Gone from the user's view: the id may be reused at once; late outputs are dropped."""
        r.retired = True
        if self.live.get(r.request_id) is r:
            del self.live[r.request_id]

    def fail_queued(self, r: Request, err: Exception) -> None:
        """A queued request that can no longer be admitted (no worker of its role will come back)."""
        self._retire(r)
        self.num_queued -= 1
        r.collector.fail(err)

    def _forget(self, r: Request) -> None:
        self._retire(r)
        self.gens.pop(r.gen, None)

    def _free_decode(self, r: Request) -> None:
        if not r.decode.released:
            r.decode.release()
            self.freed()

    def _release_decode(self, r: Request) -> None:
        """Free the decode (or unified) worker's side: only once no write into it can land."""
        if not r.decode.released:
            self._free_decode(r)
            self.post(r.decode.worker, pr.Abort([r.gen]))
        if r.writer_done:
            self._forget(r)

    def _stop_writer(self, r: Request) -> None:
        """The decode side is gone: the prefill worker drains (Drained finishes the cleanup)."""
        if r.writer_done:
            self._forget(r)
        else:
            self.post(r.prefill.worker, pr.Cancel(r.gen))

    def cancel(self, r: Request) -> None:
        """User abort / cancellation, at whatever phase the request is in."""
        self._retire(r)
        r.collector.finish("abort")
        if r.phase == Phase.QUEUED:  # on no worker: next_queued() skips it
            self.num_queued -= 1
            return
        if r.writer_done:  # single, or PD after the handoff
            self._release_decode(r)
        elif r.phase == Phase.WAITING:  # P not told yet: D drops a queued or granted reservation
            r.prefill.release()
            self._release_decode(r)
        # P may be writing into D's blocks: P drains first, D is freed on Drained/TransferDone
        else:
            self.post(r.prefill.worker, pr.Cancel(r.gen))

    # ---- worker events ---------------------------------------------------------------------------
    def on_started(self, gens: list[int]) -> None:
        for gen in gens:
            r = self.gens.get(gen)
            if r is not None and r.phase == Phase.RESERVED:
                r.phase = Phase.PREFILLING

    def decode_worker(self, gen: int) -> WorkerProc | None:
        """The request's decode worker, while it is alive (a prefill failure may be its death)."""
        r = self.gens.get(gen)
        return (
            r.decode.worker
            if r is not None and r.decode is not None and r.decode.worker.alive
            else None
        )

    def tokens_of(self, gen: int) -> list[int] | None:
        """A request's tokens so far (its prompt, then its output), or None once it is forgotten."""
        r = self.gens.get(gen)
        return None if r is None else r.prompt + r.collector.out.token_ids

    def on_token(self, w: WorkerProc, t: pr.Token) -> None:
        r = self.gens.get(t.gen)
        if r is None or r.retired:
            return  # a retired generation: drop
        # the first token, from the prefill worker
        if r.prefill is not None and w is r.prefill.worker:
            r.first_token = t.token
            r.phase = Phase.TRANSFERRING
        if t.num_cached_tokens is not None:
            r.collector.out.num_cached_tokens = t.num_cached_tokens
        if t.prompt_logprobs is not None:
            r.collector.out.prompt_logprobs = t.prompt_logprobs
        r.collector.push(t.token, t.depth, t.logprobs, t.finish)
        if t.finish is not None:
            self._retire(r)
            if w is r.decode.worker:  # the decode side finished and freed its blocks itself
                self._free_decode(r)
                if r.writer_done:
                    self._forget(r)
            # finished on the prefill worker's first token: the decode side is freed after
            # TransferDone

    def on_reserved(self, d: WorkerProc, msg: pr.Reserved) -> None:
        r = self.gens.get(msg.gen)
        if r is None or r.retired or r.decode.worker is not d:
            self.post(d, pr.Abort([msg.gen]))  # aborted while reserving: no writer was ever told
            if r is not None and r.decode.worker is d:
                self._free_decode(r)
                self._forget(r)
            return
        r.phase = Phase.RESERVED
        self.post(
            r.prefill.worker,
            pr.Prefill(
                gen=r.gen,
                prompt=r.prompt,
                params=r.params,
                priority=r.priority,
                dst_agent=d.ready.transport.agent_name,
                dst_tables=msg.tables,
            ),
        )

    def on_prefill_released(self, p: WorkerProc, gen: int, done: pr.TransferDone | None) -> None:
        """TransferDone (every chunk written, P's blocks free) or None: Drained (cancelled, nothing
        in flight)."""
        r = self.gens.get(gen)
        if r is None or r.prefill is None or r.prefill.worker is not p:
            return
        r.prefill.release()
        chunks = done.chunks if done is not None else None
        if done is not None:
            self.kv_chunks += done.chunks
            self.kv_bytes += done.bytes
            self.kv_seconds += done.seconds
        if chunks is not None and not r.retired:
            r.phase = Phase.DECODING
            self.post(
                r.decode.worker,
                pr.Activate(
                    gen=gen,
                    prompt=r.prompt,
                    params=r.params,
                    priority=r.priority,
                    first_token=r.first_token,
                    chunks=chunks,
                ),
            )
        else:
            self._release_decode(r)

    def on_failed(self, w: WorkerProc, msg: pr.Failed) -> None:
        r = self.gens.get(msg.gen)
        if r is None:
            return
        p = r.prefill
        if not r.retired and p is not None and w is p.worker and not r.decode.worker.alive:
            # P's write failed because the decode worker died (Supervisor._prefill_failed waited
            # for that): its death fails the request (on_worker_dead: EngineDeadError, how it
            # died) and frees the rest; P freed its side
            r.prefill.release()
            return
        if not r.retired:
            r.collector.finish("error", msg.error)
            self._retire(r)
        if r.prefill is not None and w is r.prefill.worker:  # P drained and freed before reporting
            r.prefill.release()
            self._release_decode(r)
        elif w is r.decode.worker:  # D freed its side before reporting
            self._free_decode(r)
            self._stop_writer(r)

    def on_writer_lost(self, p, gen: int, error: str) -> None:
        """A remote prefill node can no longer be heard (its stream broke) but may still be writing:
        the request fails now; its decode blocks are freed by the Drained its proxy reports once the
        writer's own transfer deadline has passed (rlt/dynamo/remote.py)."""
        r = self.gens.get(gen)
        if r is not None and r.prefill is not None and r.prefill.worker is p and not r.retired:
            r.collector.finish("error", error)
            self._retire(r)

    def on_worker_dead(self, w: WorkerProc, err: EngineDeadError) -> None:
        """Fail the requests the dead worker held; free what the others hold for them."""
        for r in list(self.gens.values()):
            on_p = r.prefill is not None and r.prefill.worker is w and not r.prefill.released
            on_d = r.decode.worker is w and not r.decode.released
            if not (on_p or on_d):
                continue
            if not r.retired:
                r.collector.fail(err)
                self._retire(r)
            if on_p:  # a dead writer writes nothing more: the decode side can be freed
                r.prefill.release()
                self._release_decode(r)
            if on_d:
                self._free_decode(r)
                self._stop_writer(r)

    def fail_all(self, err: EngineDeadError) -> None:
        for r in list(self.live.values()):
            r.retired = True
            r.collector.fail(err)
        self.live.clear()
        self.gens.clear()
        self._queued.clear()
        self.num_queued = 0
