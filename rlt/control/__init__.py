"""The coordinator: rlt.Engine in the caller's event loop (no torch). It owns the ModelConfig,
every request's lifecycle and the credits it holds on the workers, and talks to the workers
(rlt/workers) only through rlt/contract's messages. docs/architecture.md has the big picture; this
docstring the detail, each module's own docstring the rest.

Modules:
  frontend.py      rlt.Engine: validation, abort, health, stats
  admission.py     the admission queue: a checked request to a worker with room (router.py), in order
  launch.py        what Engine.launch returns: await it or `async with` it
  request.py       Request (one choice's life), Holding, Phase
  lifecycle.py     request phases (QUEUED first) and every phase change; credits taken and returned
  supervisor.py    worker processes: spawn, handshake, messages
  worker_proc.py   one worker as the coordinator sees it (process, credits, outbox, log, the prompt
                   blocks sent to it)
  forkserver.py    CPU workers forked from a server process that imported torch once
  liveness.py      heartbeats, a dead worker's requests, restart, giving up
  log_dir.py       where a launch's worker logs go, kept after shutdown (the newest few launches)
  connector.py     declared seams for a multi-host backend: PrefillConnector / RemoteWorker /
                   SlotHost (decode side), EventSink (prefill side)
  cache_events.py  prefix-cache blocks stored / removed, relayed to a watcher (Dynamo's KV router)
  transport.py     the ROUTER socket: sends that wait while a worker's queue is full, never drop
  devices.py       a device per worker, checked before anything starts
  run.py           a command's coroutine on uvloop, SIGTERM and SIGHUP handled as Ctrl-C
  router.py        the worker holding a prompt's prefix, else the least loaded; PD: prefill on the
                   decode worker or not; blocks needed
  stream.py        RequestStream, what generate returns: a call's n choices tagged by index, text
                   detokenized incrementally (grows only), stop strings cut at the token that
                   completes one; aborts on close, cancel or drop at any point
  collector.py     per-choice output slot; a call's choices share one event (no unbounded queue)
  stats.py         Engine.stats(): typed structs (engine, per worker, prefix cache, KV handoff)
  outputs.py       RequestOutput: what a request's stream yields, one choice at a time
  detokenizer.py   incremental detokenization: a request's output ids -> its text, in O(tokens)

Admission. A queued request is admitted at once while a worker it can go to holds fewer than
2 x max_num_seqs requests (max_num_seqs running and as many waiting, so a slot that frees is
refilled at the worker's next step without a round trip); past that it waits in the coordinator,
admitted in (priority, arrival) order as workers give slots back, where routing then sees the
freshest load. Past max_queued_requests (default 4,096) more, the call raises
EngineOverloadedError at once (HTTP 503 with Retry-After; vLLM's queue is unbounded, SGLang's
--max-queued-requests is the same bound): every request completes, fails with an error, or is
refused at the call. Admission picks workers (router.py) and takes credits (the blocks of its
prompt and first decode position on every plane, one slot: a routing estimate, the worker grows
the request's blocks). An abort of a queued request touches no worker. A queued request whose
role has no ready worker waits while one restarts; when a worker the topology needs will not come
back (restart off, or its attempts ran out) queued requests fail and Engine.wait_failed() returns
the reason (`rlt serve` exits 1).

Routing (router.py). The coordinator keeps, per worker, the prefix-cache block keys of the prompts
it sent there (LRU, bounded by the worker's pool, a prompt's head kept longest) and sends a prompt
to the replica or prefill worker holding its longest prefix, unless that one has over 32 more
requests in flight than the least loaded, and over 1.5x as many (then the least loaded: balance
first, as SGLang's cache-aware router), or is a prefill worker whose queue is full
(max_prefill_queue_size). In PD a short prompt (max_local_prefill_length) or a busy prefill worker
(max_prefill_queue_size) is prefilled by the decode worker itself, as in `single`.

Messages. Those to one worker go through its outbox (an asyncio queue and one sender task), so they
keep their order (Reserve before Abort, Prefill before Cancel) without the caller waiting. No
message is dropped: a worker's ZeroMQ pipe holds 1,000 messages; when it is full the ROUTER's send
raises EAGAIN (with ROUTER_MANDATORY; waiting for POLLOUT says nothing, since the ROUTER is
writable while any peer's pipe has room, the worker's own heartbeat socket among them). The sender
keeps the message and retries it every 1-20 ms: backpressure, never loss. A worker is gone only
when liveness says so (its exit, a silent heartbeat), never because a send failed; its death
handler then fails its requests. The receive loop never waits on a send (a worker blocked sending
its outputs would never read, and the two would wait on each other).

Writer before reader. Abort is legal in every phase. The request leaves the user's view at once,
but a decode worker's blocks are freed only after the prefill worker confirmed that no write into
them is in flight (Drained after Cancel, TransferDone, or its death). Credits return exactly once
(Holding.release).

Failure isolation. A failed or late transfer fails only its request (finish_reason "error", message
attached). A dead worker fails only the requests it held (their streams raise EngineDeadError);
the others' resources are released in the same order. The supervisor notices death by process
exit; it kills a worker whose heartbeat goes silent (a thread with its own socket, so a long step
still beats) or whose progress stops while it has work for heartbeat_timeout
(rlt/workers/counters.py). A watch that itself wakes late (the caller's loop held up, the whole
machine paused) judges nobody on that tick: the silence was shared, and heartbeats sent meanwhile
are still unread. The requests' error says how the worker ended (the signal or exit code, "killed
after no heartbeat for N s", "main loop stuck") and the exception that ended its log, if any. It
then restarts the worker (restart=True; up to restart_attempts tries, backing off from 0.5 s to
30 s, so a passing cause does not leave the engine dead), checks its fingerprint and re-introduces
its NIXL peers.

The caller's loop is never held. Options, the model's files and the KV budget are checked when
Engine.launch is called, before anything starts. Awaiting it loads the tokenizer in a thread while
it spawns workers with subprocess.Popen in a thread (vfork + exec: a fork from the loop thread
copies a large coordinator's page tables, ~70 ms with torch loaded) and watches their exit through
a pidfd on the loop. A CPU worker instead forks from the process's fork server (forkserver.py, one
per coordinator process and import-time environment: PYTHONPATH, OMP_*, TORCH*, ...), which
imported torch and the worker's modules once: importing them was ~85 % of a CPU worker's start
(~2.5 s of CPU), so a second launch in a process, a 1p1d pair's second worker and a restart after
a crash start in milliseconds (a 1p1d launch on the tiny model: 3.3 s, then 1.1 s for each next
one). The server dies with the coordinator and exits after 30 s with no worker; it reports each
worker's exit code on a socket of its own, watched on the loop. A GPU worker is always spawned
fresh: its start is its weights and warm-up, and CUDA must not be initialized before a fork. The
heap is frozen (gc.freeze()) before and after start-up, as vLLM's server does, so a full
collection scans only newer objects instead of stalling the loop for the whole heap (65-100 ms with
torch loaded). tests/control/test_api.py probes the loop's lag through launch, 32 streams and
shutdown: under 20 ms.

Workers share a CPU politely: CPU workers of one topology split the cores between them but one,
left to the coordinator (a lone worker on two cores: one thread, the same tok/s as two and
inter-token gaps several times shorter while requests arrive, measured against `rlt serve` in
issue #61).
"""
