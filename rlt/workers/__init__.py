"""The worker process: one per device, it owns all device state (weights, KV pool, hidden states,
sampling) and runs the loop-level continuous-batching engine. It shares nothing with the
coordinator (rlt/control) but rlt/contract's options and messages. docs/architecture.md has the
big picture; this docstring the detail, each module's own docstring the rest.

Modules:
  worker_main.py      HELLO -> Handshake -> load, fingerprint, size the pool, warm up -> READY ->
                      the loop
  forkserver_main.py  the fork server: torch and the worker's modules imported once, a worker
                      forked per request (its own session, log, environment), exit codes reported
  lifetime.py         a worker-side process's tie to its parent
  worker.py           the main loop: drains messages, steps the engine, drives its role's part
  roles/              each role's part behind one interface (Side): unified; PrefillSide (posts KV
                      writes, reports them done); DecodeSide (reserves, counts notifications)
  outbox.py           every message the worker sends, and failing a request
  counters.py         WorkerCounters: progress for the heartbeat thread, and the captures and Triton
                      specializations built after READY, counted for stats()
  engine.py           LoopEngine: one step (launch a pass, read the last one back)
  steady_stretch.py   LoopEngine's stretches of steady decode: enter, leave, grow lanes, read back
  scheduler.py        which requests run: admission, blocks as requests grow, preemption
  sequence.py         one request in the engine: positions, rows, recompute after preemption
  speculation.py      looped self-speculation: the first loops draft, the rest verify
  memory.py           KV pool size: num_blocks, kv_memory_bytes or gpu_memory_utilization (profiled)
  warmup.py           before READY: every CUDA graph and Triton specialization serving can meet
  runner.py           one core pass on the device: metadata, exits, finalize copies, sampling
  backend.py          the kernel backend, chosen once from the config: the model's layer
                      operations, attention and its pass metadata, CUDA graphs (which pass replays)
  pass_rows.py        a pass's rows: positions, KV slots, padded tables
  sampling.py         sampled rows' parameters and logit edits (regular path; steady lanes)
  penalties.py        penalty state: a device slot per running penalized request (counts, tokens)
  grammar.py          structured output: grammars compiled off the loop, cached; a matcher each
  grammar_compile.py  the compile processes (a bounded pool), forked from grammar_zygote.py's zygote
  prompt_logprobs.py  prompt logprobs as prompt chunks leave the loop, kept until the first token
  steady.py           steady decode: lanes on the device, no host work between passes
  steady_boundary.py  ... Huginn's: criteria checked on the device, parked exits, boundary passes
  cuda_graphs.py      core passes captured per (row bucket, block-table width): decode, prompt
  prompt_graphs.py    graphs of a pass holding one prompt chunk at position 0 (dense flash SDPA)
  kv_pool.py          the depth-aware paged pool and block tables
  prefix_cache.py     cached blocks by key (tokens and depths of the whole prefix), refcounts, LRU
  kv_transfer.py      KVTransport: one NIXL agent over the pool; WRITE + "gen:seq" notifications
  step_buffers.py     one host-to-device copy per step; asynchronous read-back
  exit_policy.py      Ouro's hazard / CDF exit rule
  exit_criteria.py    Huginn's exit criteria (latent-diff, cosine, kl, minp-kl, entropy-diff,
                      argmax-stability)
  group.py            a request's rows in a pass (Group), tokens still on the device (PendingTokens)
  faults.py           fault injection (testing only)

PD, the workers' side. The prefill worker runs the prompt at its max_loops (every plane up to it)
and, as each chunk's KV is final, WRITEs it into the blocks the decode worker reserved, over NIXL
with a `gen:seq` notification: on CUDA once the device has finished the pass that stored it (the
host runs a pass ahead, and NIXL copies outside the compute stream, so each step with final chunks
records an event and their writes are posted when it has passed). It samples the first token from
the last prompt row and streams it before the KV moves; when every write has completed it frees
its own blocks and sends TransferDone(chunks), and the decode worker continues the stream once all
`chunks` notifications have arrived. The prefill worker never waits in its loop for a cancelled or
failed generation: its writes are polled with the others, and its reply (Drained) goes once none
can still land. A worker that frees blocks its queued kernels may still write synchronizes before
handing them to a peer's writes. The prefill worker polls each write against transfer_timeout;
the decode worker gives up on missing notifications after it; either fails that request alone.
One block of one plane is contiguous across layers, so a prompt's KV moves as runs of consecutive
blocks merged into few large NIXL descriptors.

Liveness. A heartbeat thread with its own socket beats through a long step; the counters' progress
moves with every main-loop iteration and every layer of a pass, so a long prompt chunk is not a
hang. Workers share a CPU politely: OMP_WAIT_POLICY=PASSIVE unless set, and a CPU worker's grammar
pool freezes the heap again after importing xgrammar at its first grammar (else a full collection
scans it on the pass loop).

Blocks on demand (scheduler.py, sequence.py). A request is admitted, in (priority, arrival) order
with the head waiting for blocks, with the blocks of its prompt and first decode position, and
takes one more block per plane as it crosses a block boundary (steady-decode lanes get theirs in
place, one pass ahead). When the pool is empty the lowest-priority, newest running request is
preempted: its blocks come back and it waits again; a pass that preempted admits nobody. Resumed,
it recomputes its KV: the prompt at its max_loops, then every generated position as a single row
run to the depth its token exited at, with no sampling (under LAST_EXITED its finalize copies too;
under SHARED one position at a time, as first computed; with Huginn's coda no position in flight
exits before an earlier one, whose coda K/V its coda reads). Every plane then holds what it held,
and tokens, exit depths and logprobs go on as if never preempted (float64: bit for bit;
tests/workers/test_preemption.py). A request that could not fit even alone is refused at once.
stats() counts preemptions per worker. A PD decode worker reserves the prompt's blocks and its
first decode position; the prefill worker writes the prompt into them. Padding rows of CUDA graphs
and ended steady-decode lanes write only the scratch block.

Prefix cache (prefix_cache.py; on by default, enable_prefix_caching). A position's KV on every
plane depends on the tokens up to it and the depth each of those positions ran at (the prompt's at
its request's max_loops, a generated one's at its token's exit depth), on Huginn's initial latent
(drawn from the request's state seed under like-init), and on the worker's weights and layout,
which a pool never outlives. So a logical block, every plane together, is keyed by a SHA-256 chain
over (tokens, depths) block by block, rooted in the state seed where it matters
(rlt/contract/prefix_keys.py); equal keys mean equal KV. A request's full blocks of final positions
whose depths are known go into the cache as its prompt chunks finish and when it releases its
blocks (finish, abort, preemption); a key already cached leaves the request's copy its own.
Admitted (or resumed), a request takes the longest cached prefix of the positions it knows and
that need no sampling (a new prompt's all but its last position; a resumed request's all but the
one its last token is fed at; keys hashed in doubling runs up to the first miss, so a cold
prompt's first pass waits for one key, the rest hashed as its blocks are cached), shares those
blocks by reference and computes from the next position. So generated positions are reused only
where their depth matches: a second turn whose first turn exited early reuses its prompt and no
block after the first early exit. A request whose next uncached block a running request is
computing now (a burst sharing a new system prompt) waits for that block to be cached instead of
computing it too, as SGLang's in-batch prefix sharing. Nothing writes a cached block: hits end
before the first computed position, and only final positions are cached. Cached blocks nobody
holds count as free; taking blocks evicts them least recently released first, a request releasing
its blocks last to first (a prefix's tail goes before its head). Warm-up forgets its requests'
blocks. A hit is num_cached_tokens on the request's first token; stats() and /metrics count tokens
looked up and found and the blocks cached. A request asking for prompt_logprobs takes no hits
before its first token (its positions must run).
  In PD the prefill worker serves a hit from its own cache and writes the cached blocks to the
decode worker with the computed ones (one more write, posted at admission); the decode worker does
not look its own cache up for a handed-off prompt (its blocks go to its cache when the request
ends, for the prompts it prefills itself and for resumes after preemption). Why: the first token
streams from the prefill worker before any KV moves, so the cached blocks' write is off the TTFT
path; it costs the link, at most 4.1 ms for a whole 4,096-token Nanbeige4.2-3B prompt (704 MiB,
512 scattered blocks, measured in docs/performance.md), against the 171 ms of computing it cold;
reusing the decode worker's own cache would need both workers' caches to agree per request (a
reserve answered with a hit length, a prefill that skips writing those blocks), and would pin
decode memory with prompts that only prefill workers compute.

Pool size (memory.py): num_blocks, else kv_memory_bytes, else on CUDA what gpu_memory_utilization
(0.9) of the device leaves once the weights, the largest passes' activations (measured by running
them: max_num_batched_tokens prompt rows, then max_num_seqs sampled rows) and memory outside
torch's allocator are counted, as vLLM does; the rest of the 10 % holds CUDA graphs. On the CPU,
1 GiB. At most 65,536 blocks.

A pass's rows (engine.py). Prompt chunks (to their request's max_loops, the model's depth by
default, up to prefill_chunk rows each; as the references run a prompt at a given depth) and
decode tokens share the pass, under max_num_batched_tokens; while streams decode, under
decode_pass_rows (1,536 by default), the streams' tokens counted first and prompts chunked into
the rest: a prompt chunk stays in the pass for every loop it runs, and each such pass delays every
decoding stream's next token (Sarathi-Serve's token budget). While at most half of max_num_seqs
streams decode, a pass's first prompt may take twice that, twice again each time they halve (rows
times streams delayed stay bounded: a long prompt is not cut up for a few streams), the pass's
other prompts only what decode_pass_rows leaves (short prompts are not batched into long passes);
the trade-off against time to first token is measured in docs/performance.md. A group that leaves
the loop gets its head; if it ends a prompt or is a decode token it is sampled, and its request's
next group joins the next pass.

Exits. Ouro (exit_policy.py): hazard lambda = sigmoid(gate), exit at the first depth >= min_loops
where 1 - prod(1 - lambda) >= exit_threshold, else at max_loops. Huginn (exit_criteria.py, a
request's exit_criterion: latent-diff, cosine, kl, minp-kl, entropy-diff, argmax-stability,
exit_threshold read per criterion, the authors' "auto" thresholds by default): checked per decode
row after loops min_loops .. max_loops - 1, each against the value at the row's previous check, as
the authors' generate_with_adaptive_compute checks them; the logit criteria run the coda and head
for the rows they check. A request's tokens and depths do not depend on its batch, and at batch 1
they equal the authors' code (tests/workers/test_exit_criteria.py, against outputs recorded by
dev/huginn_reference.py). The host reads the verdicts one pass late (the pass after a check holds
the checked rows: an exited row keeps its state and writes its K/V to the scratch block). With
exit_wait_passes > 0 an exited row stays parked that way until the tail (coda, head, sampling, the
next token's prelude) runs for another group, or it has waited that many passes: the tail, as heavy
as the core, then runs once for several rows.

The host stays ahead of the device: a step's metadata goes in one host-to-device copy
(step_buffers.py); the exit mask is read back only when some row's exit depends on its gate or its
exit criterion at this depth; sampled tokens come back one step late, because the next pass (whose
new decode rows take those tokens on the device) is launched before they are read.

Sampling (sampling.py, rlt/kernels/sampler.py) is Gumbel-max over counter-based noise, a pure
function of (seed, output index, token id), so any worker samples any position identically. Before
it, in vLLM's order, the logits are edited: logit_bias, min_tokens (EOS and stop ids at -inf), then
the repetition, frequency and presence penalties; min_p follows temperature. Logprobs stay those
of the raw logits. Each running penalized request holds a slot of device state (penalties.py: per
token, in the prompt or not and its output count; the list of tokens that are either), loaded from
the host's tokens at admission (or resumption, or PD activation) and appended to on the device by
the pass that samples each token, so steady decode and unread tokens need no host. A step edits
only the listed logits: one Triton launch on CUDA (rlt/kernels/penalties_triton.py),
O(rows x listed tokens). prompt_logprobs (prompt_logprobs.py) are computed as each prompt chunk
leaves the loop: every row of the chunk (Huginn: after its coda) projected max_num_seqs rows at a
time, so the logits never outgrow decode sampling's; they go with the request's first token (in
PD, from the prefill worker).

Structured output (grammar.py, grammar_compile.py; the specs: rlt/contract/grammar.py). A worker
compiles specs against the vocabulary in child processes of its own (two by default, at nice 10,
forked from a zygote that imported xgrammar once, so a replacement starts in milliseconds; a GPU
worker starts them beside its warm-up and READY waits for them, a CPU worker at its first
grammar): a compile past grammar_compile_timeout, or whose requests have all gone, is abandoned by
killing its process; the result comes back serialized and is cached by spec. The request waits in
the scheduler until its grammar is ready (a compile that fails, times out or can match nothing
fails that request alone). Each constrained request has a matcher that has accepted every output
the host knows (a PD decode worker's starts with the prefill worker's first token; preemption keeps
it). Its next decode row starts before its last token is read back, like any other; when the row
leaves the loop the host fills its bitmask (over the model's whole vocabulary; a row that exits in
its first pass reads that one token at once) and the sampler puts -inf on the tokens it disallows,
after the other edits. Unconstrained rows cost nothing; constrained requests keep the regular path
(not steady). A grammar may wait for a token sequence in the output (StructuredOutput.after): until
the outputs hold it the row has no mask, and the outputs after it go through the matcher. The
matcher tracks the sequence as it accepts outputs, so a rebuilt one (a PD decode worker's) replays
to the same state; the prefill worker's first token is sampled unmasked.

Steady decode (steady.py, steady_stretch.py). When every running request has exactly one decode
row in flight and nothing waiting could be admitted, the requests become device-side lanes (state,
depth, position, survival, block tables, sampling parameters) and passes run with no host work
between them: exits, sampling, finalize copies and the next token's embedding happen on the device
under masks. steady_decode="adaptive" (default) uses it while some request can exit early;
"always", "never". It ends when a request becomes admissible or over a quarter of the lanes have
ended. Ouro and Nanbeige run it, and Huginn (steady_boundary.py): each pass checks the lanes'
criteria on the device (the logit criteria over the coda and head of every lane) and parks the
exited ones (state kept, K/V to the scratch block, position 0 so its attention reads one block).
Every exit_wait_passes passes once the host has read that some lane is parked, or once it reads
that every lane is (at fixed depth: the passes where lanes reach it; the host reads each pass's
counts at most one pass behind its launches, waiting if need be, so it never decides on counts many
passes old), a boundary pass takes all parked lanes out at once: finalize copies (one launch over
every lane and plane, moving only the slots the exits need), coda and head over every lane (their
weights are read whatever the row count; rows not exiting attend to one block), sampling, and the
prelude and initial latent of each new token. A pass's bookkeeping on the device is a few single
launches (rlt/kernels' lane_rows, lane_checks and kv_copy) rather than dozens of small tensor
operations.

The kernel backend (backend.py), built once at start-up from the device, `kernels` and
`batch_invariant`: the Triton kernels and CUDA graphs on CUDA, or with kernels="reference" the
plain torch reference (what the CPU always runs). It hands the model its layer operations
(rlt/models/ops.py: reference, Triton, batch-invariant Triton; each a method bound once), builds
each pass's attention metadata (PagedMetadata, with the Triton kernels' plan) and picks, per pass,
an eager run or a CUDA graph's replay. The kernels themselves: rlt/kernels/__init__.py.

CUDA graphs (cuda_graphs.py, prompt_graphs.py). A core pass is a dozen kernels per layer,
launch-bound unless it carries thousands of rows, so both kinds of pass replay graphs. Decode-only
passes of up to cuda_graph_max_batch rows: per padded batch size and block-table width (powers of
two), attention by the decode kernel. Passes carrying prompt chunks (alone or with decode rows) of
up to max_num_batched_tokens rows (at most 2048): per padded row count and table width, attention
by the general paged kernel (the pass's tiles and key slices are graph inputs). A pass holding only
one prompt chunk at position 0 (a lone prompt's first chunk, up to prefill_chunk rows) replays a
graph of its own per padded row count, attention by dense flash SDPA over its own rows as an eager
pass runs it (padding rows come last, write the scratch block). Each row's depth is only its block
table, a graph input. A pass over 2048 rows or 256 groups runs eagerly. A capture runs with
Python's garbage collector off: a graph freed mid-capture (say, an engine left in a reference
cycle) would destroy its executable then, which CUDA forbids and which voids the capture.

Warm before READY (warmup.py). A worker runs synthetic requests through its own engine (prompt
lengths giving every row-count and table-width class, alone and together with decode rows, greedy
and sampled, fixed depth and adaptive exit) after capturing every graph bucket (largest first, so
smaller graphs reuse the graph memory) up to the widest table a request can have; its log has the
progress and the duration. Layer indices, table widths and row counts are not Triton
specializations (do_not_specialize): one variant serves them all. stats() counts per worker the
captures and specializations built after READY (counters.py; a GPU test holds them at 0 through a
mixed run).

Fault injection: Engine.launch(faults=rlt.contract.config.Faults(...)) (a LaunchConfig field)
makes workers stall on a prompt, fail or lose its KV write's notifications, or report another
fingerprint. Only worker_main.py reads it, wrapping the worker and its transport with faults.py;
no product path checks for faults.
"""
