"""Warm-up before READY: every CUDA graph and Triton specialization serving can meet is built
now, so nothing compiles or captures after the worker says READY (each would stall every request
on the worker: first-use work is counted per worker in stats()).

1. CUDA graphs: of decode passes, every (batch bucket, table width bucket) up to
   cuda_graph_max_batch rows; of passes carrying prompt chunks, every (row bucket, table width
   bucket) up to max_num_batched_tokens rows; widths up to the widest table a request can have
   (max positions, or the pool). Largest first: later, smaller graphs reuse the graph memory.
2. Passes: synthetic requests through the engine itself (its pool, its scheduler): prompts of
   lengths that give every row-count and table-width class a pass can have (one row, a few, a tile,
   a dense chunk, chunks after a prefix, a full pass), alone and all together with decode rows in
   the same passes, greedy and sampled, with and without logit edits, penalties, a grammar and prompt
   logprobs, fixed depth and adaptive exit (steady decode; Huginn's lanes in batches of one, a few,
   16 and all). Everything they take is returned.
On CPU (the torch reference kernels) there is nothing to warm.
"""

import time

from rlt.contract.sampling_params import SamplingParams
from rlt.contract.validation import resolve_params
from rlt.workers.memory import EDITS, finish, grammar


def _prompt_lengths(engine) -> list[int]:
    cfg, bs = engine.cfg, engine.pool.block_size
    chunk, rows = cfg.prefill_chunk, cfg.max_num_batched_tokens
    lengths = {1, 2, 3, 15, 16, 17, 63, 64, 65, 16 * bs + 1, chunk, chunk + 17, 2 * chunk + 5, rows}
    room = engine.pool.num_blocks // engine.pool.planes(engine.mc, engine.pool.layout) * bs
    cap = min(engine.mc.max_positions - 8, room // 4)
    return sorted(n for n in lengths if 0 < n <= cap)


def _params(engine) -> list:
    gated = engine.mc.has_exit_gate
    kinds = [
        SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
        SamplingParams(
            max_tokens=4, temperature=1.0, top_k=5, top_p=0.9, seed=0, ignore_eos=True, logprobs=5
        ),
    ]
    if gated:
        kinds.append(
            SamplingParams(
                max_tokens=6, temperature=0, ignore_eos=True, exit_threshold=0.5, min_loops=2
            )
        )
    if engine.mc.has_exit_criteria:  # the coda and head over the rows a logit criterion checks
        kinds.append(
            SamplingParams(
                max_tokens=4, temperature=0, ignore_eos=True, exit_criterion="kl", min_loops=2
            )
        )
    # logit edits, penalties and min_p, in the regular path and steady decode (adaptive, if gated)
    exits = dict(exit_threshold=0.5, min_loops=2) if gated else {}
    # (held back to the end: runs every pass)
    edits = EDITS | dict(min_tokens=4, stop_token_ids=[0])
    kinds.append(
        SamplingParams(
            max_tokens=4, temperature=0.8, seed=1, ignore_eos=True, logprobs=2, **edits, **exits
        )
    )
    kinds.append(
        SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, prompt_logprobs=3, **edits)
    )
    return kinds


def _lane_kinds() -> list:
    """Requests a boundary family (Huginn) serves as steady-decode lanes: a latent criterion, greedy
    and sampled with logprobs."""
    return [
        SamplingParams(
            max_tokens=4, temperature=0, ignore_eos=True, exit_criterion="latent-diff", min_loops=2
        ),
        SamplingParams(
            max_tokens=4,
            temperature=1.0,
            top_k=5,
            seed=0,
            ignore_eos=True,
            logprobs=3,
            exit_criterion="cosine",
        ),
    ]


def _run(engine, requests) -> None:
    """requests: [(prompt, SamplingParams)] at once, to the end; every block comes back, and the
    prefix cache forgets them (each warm-up prompt runs its passes in full: its prefix was not
    cached by the one before)."""
    free = engine.pool.num_free
    for i, (prompt, sp) in enumerate(requests):
        engine.add_request(("warm-up", i), prompt, resolve_params(engine.mc, len(prompt), sp))
    finish(engine)
    engine.pool.clear_cache()
    assert engine.pool.num_free == free, "warm-up requests returned their blocks"


def warm_up(engine, decodes: bool = True, log=print) -> str:
    """-> a line saying what was built and how long it took. decodes: False on a prefill worker
    (it hands every request off after its first token: no decode graphs)."""
    if not engine.backend.needs_warm_up:
        return "warm-up: nothing to build (torch reference kernels)"
    counters = engine.counters
    t0, captures, compiles = time.monotonic(), counters.captures, counters.compiles
    shapes = engine.backend.graph_shapes(engine.runner.max_table_width, decodes)
    for i, (graphs, rows, w) in enumerate(shapes):
        graphs.capture(rows, w)
        if (i + 1) % max(1, len(shapes) // 10) == 0 or i + 1 == len(shapes):
            log(f"warm-up: CUDA graphs {i + 1}/{len(shapes)} ({time.monotonic() - t0:.1f} s)")
    vocab = engine.mc.vocab_size
    prompt = lambda n, k=0: [(7 * j + 13 * k + 1) % vocab for j in range(n)]  # noqa: E731
    lengths, kinds = _prompt_lengths(engine), _params(engine)
    for n in lengths:  # each alone: its prompt's passes without neighbours
        _run(engine, [(prompt(n), kinds[0])])
    log(f"warm-up: prompts of {len(lengths)} lengths alone ({time.monotonic() - t0:.1f} s)")
    mixed = [(prompt(n, k), kinds[k % len(kinds)]) for k, n in enumerate(lengths * len(kinds))]
    _run(engine, mixed[: engine.cfg.max_num_seqs])  # prompt chunks and decode rows sharing passes
    many = [(prompt(1 + k % 5, k), kinds[k % len(kinds)]) for k in range(engine.cfg.max_num_seqs)]
    _run(engine, many)  # a full batch of decode rows (steady decode where a request can exit early)
    # steady decode's lanes and boundary passes: one, a few, 16, every lane
    if engine.pool.has_boundary:
        lane_kinds = _lane_kinds()
        lanes = [lane_kinds[k % 2] for k in range(engine.cfg.max_num_seqs)]
        for n in sorted({min(n, len(lanes)) for n in (1, 3, 16, len(lanes))}):
            _run(engine, [(prompt(2 + k % 3, k), sp) for k, sp in enumerate(lanes[:n])])
    # structured output (regular path only): the bitmask in the sampler, beside other rows
    if grammar(engine.mc):
        sp = SamplingParams(max_tokens=4, temperature=0.7, seed=2, logprobs=1, **grammar(engine.mc))
        _run(
            engine,
            [
                (prompt(1 + k, k), sp if k % 2 else kinds[1])
                for k in range(min(8, engine.cfg.max_num_seqs))
            ],
        )
    log(f"warm-up: mixed passes ({time.monotonic() - t0:.1f} s)")
    return (
        f"warm-up: {counters.captures - captures} CUDA graphs, "
        f"{counters.compiles - compiles} Triton "
        f"specializations in {time.monotonic() - t0:.1f} s"
    )
