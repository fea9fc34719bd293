"""Admission: which worker takes a queued request, and when (the front end, frontend.py, has checked
the request). A worker holds up to WORKER_DEPTH x max_num_seqs requests; the rest wait in the
coordinator's queue, first the lowest priority value, and are pumped to a worker when one has room
(a slot freed, a worker READY) at the next turn of the caller's event loop. Where each goes is the
router's (rlt/control/router.py)."""

import asyncio

from rlt.contract.config import EngineConfig, LaunchConfig
from rlt.control import router
from rlt.control.collector import Collector
from rlt.control.lifecycle import Phase, Request
from rlt.control.outputs import RequestOutput
from rlt.control.supervisor import Supervisor
from rlt.control.worker_proc import WorkerProc
from rlt.errors import EngineDeadError, EngineOverloadedError, RequestError

WORKER_DEPTH = 2  # requests a worker holds, in units of max_num_seqs (Admission._has_room)


class Admission:
    def __init__(self, supervisor: Supervisor, engine: EngineConfig, launch: LaunchConfig):
        self._supervisor, self._lifecycle = supervisor, supervisor.lifecycle
        self.engine_config, self.launch_config = engine, launch
        self.loop: asyncio.AbstractEventLoop | None = None  # the caller's, once launched
        self._pump_scheduled = False
        self._lifecycle.freed = supervisor.on_worker_ready = self._schedule_pump

    def ready(self, role: str) -> list[WorkerProc]:
        """The role's READY workers (EngineDeadError, why, where none is)."""
        if self._supervisor.closing:
            raise EngineDeadError("the engine was shut down")
        workers = self._supervisor.ready(role)
        if not workers:
            raise EngineDeadError(self._supervisor.dead_reason or f"no {role} worker is ready")
        return workers

    @property
    def decode_role(self) -> str:
        # (the topology, parsed once)
        return "decode" if self._supervisor.slots[0][0] == "prefill" else "unified"

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        """Refuse at the call what no worker could ever hold, and a PD call with no prefill worker
        ready (one already queued waits for the restart)."""
        if self.decode_role == "decode" and self._supervisor.remote_prefill is None:
            self.ready("prefill")
        d = max(self.ready(self.decode_role), key=lambda w: w.ready.kv_blocks_total)
        need = router.blocks_for(d.ready, prompt_len + max_tokens)
        if need > d.ready.kv_blocks_total:
            raise RequestError(
                f"prompt {prompt_len} + max_tokens {max_tokens} needs {need} KV blocks, "
                f"the worker has {d.ready.kv_blocks_total}: it can never fit"
            )

    def queue(
        self, names: list[str], ids: list[int], params: list, priority: int, wake
    ) -> list[Request]:
        """Queue a call's choices together and pump; all refused (EngineOverloadedError) where some
        must wait and the queue is past max_queued_requests."""
        lc, requests = self._lifecycle, []
        for i, (name, p) in enumerate(zip(names, params)):
            out = RequestOutput(name, ids, logprobs=[] if p.logprobs else None, index=i)
            requests.append(lc.queue(name, ids, p, priority, Collector(out, wake)))
        self._pump()
        if (
            any(r.phase == Phase.QUEUED for r in requests)
            and lc.num_queued > self.launch_config.max_queued_requests
        ):
            for r in requests:
                lc.cancel(r)
            raise EngineOverloadedError(
                f"the engine is full: its workers hold their share and max_queued_requests "
                f"({self.launch_config.max_queued_requests}) more wait; retry later"
            )
        return requests

    def _has_room(self, w: WorkerProc) -> bool:
        """A worker holds up to max_num_seqs running and as many waiting (so a slot that frees is
        refilled at its next step, without a round trip); further requests wait in the coordinator."""
        return w.credits.slots < WORKER_DEPTH * self.engine_config.max_num_seqs

    def _pump(self) -> None:
        """Admit queued requests, first the lowest priority value, while a worker has room. A request
        whose role has no ready worker waits while one restarts, else fails."""
        self._pump_scheduled = False
        lc = self._lifecycle
        while (r := lc.next_queued()) is not None:
            try:
                if not self._dispatch(r):
                    return
            except EngineDeadError as e:
                if self._supervisor.restarting and not self._supervisor.closing:
                    return  # pumped again when the worker is back
                lc.fail_queued(r, e)

    def _schedule_pump(self) -> None:
        """A worker's slot came back: admit at the next loop turn (not inside the event that freed it).
        (The loop as launch found it: Dynamo's runtime closes a stream where no loop is running.)"""
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self.loop.call_soon_threadsafe(self._pump)

    def _dispatch(self, r: Request) -> bool:
        """Send a queued request to its workers (rlt/control/router.py route), if one has room."""
        ids, pd = r.prompt, self.decode_role == "decode"
        workers = [w for w in self.ready(self.decode_role) if self._has_room(w)]
        if not workers:
            return False
        caching = self.engine_config.enable_prefix_caching
        keys = router.prompt_keys(
            self._supervisor.mc,
            caching,
            ids,
            r.params,
            self._supervisor.ready("prefill") if pd else workers,
        )
        d, prefill = router.route(
            self.launch_config, len(ids), workers, self.ready("prefill") if pd else None, keys
        )
        if pd and prefill is None:
            self._lifecycle.prefilled_locally()
        self._lifecycle.admit(
            r,
            d,
            # what it holds at first: it grows as it decodes
            router.blocks_for(d.ready, len(ids) + 1),
            prefill,
            router.blocks_for(prefill.ready, len(ids)) if prefill else 0,
        )
        return True
