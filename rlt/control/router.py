"""Routing: which worker of a role takes a request, and whether a PD request is prefilled by its
decode worker itself (conditional disaggregation, as NVIDIA Dynamo does).

A prompt goes to the worker most likely to hold its longest cached prefix (the coordinator's record
of the prompts it sent each worker: rlt/control/worker_proc.py PrefixIndex), unless that worker is
much busier than the least loaded one (then balance wins, as SGLang's cache-aware router does)."""

from rlt.contract import protocol as pr
from rlt.contract.config import LaunchConfig
from rlt.contract.prefix_keys import prompt_keys as chain_keys
from rlt.contract.prefix_keys import root_key
from rlt.contract.sampling_params import ResolvedParams
from rlt.control.worker_proc import WorkerProc
from rlt.models.model_config import ModelConfig

# A worker holding the prefix is passed over when it has more requests in flight than the least
# loaded worker by more than this many, and by more than this factor.
BALANCE_ABS, BALANCE_REL = 32, 1.5


def prompt_keys(
    mc: ModelConfig, caching: bool, prompt: list[int], p: ResolvedParams, workers: list[WorkerProc]
) -> list[bytes] | None:
    """Prefix-cache keys of the prompt's full blocks, for routing among several workers (None: one
    worker, or no prefix cache)."""
    if not caching or len(workers) < 2:
        return None
    root = root_key(mc.family_config.random_initial_state, p.state_seed)
    return chain_keys(root, prompt, p.max_loops, workers[0].ready.block_size)


def least_loaded(workers: list[WorkerProc]) -> WorkerProc | None:
    """Most free blocks after credits, then fewest slots."""
    return max(
        workers,
        key=lambda w: (w.ready.kv_blocks_total - w.credits.blocks, -w.credits.slots),
        default=None,
    )


def by_prefix(workers: list[WorkerProc], keys: list[bytes], usable=None) -> WorkerProc | None:
    """The worker for a prompt whose full blocks have prefix-cache keys `keys`: the usable one
    holding the longest prefix of them, unless it is much busier than the least loaded."""
    least = least_loaded(workers)
    candidates = [w for w in workers if usable is None or usable(w)]
    if not candidates:
        return least
    matched = {w.identity: w.prefixes.match(keys) for w in workers}
    best = max(candidates, key=lambda w: matched[w.identity])
    busy, idle = best.credits.slots, least.credits.slots
    if matched[best.identity] > matched[least.identity] and not (
        busy - idle > BALANCE_ABS and busy > BALANCE_REL * idle
    ):
        return best
    return least


def remember(w: WorkerProc, keys: list[bytes]) -> None:
    """The prompt was sent to `w`: its blocks will be cached there."""
    w.prefixes.add(keys, w.ready.kv_blocks_total // w.ready.kv_planes)


def prefill_locally(launch: LaunchConfig, prompt_len: int, prefill: WorkerProc) -> bool:
    """A short prompt, or a prefill worker with a queue: the decode worker prefills the request as a
    unified worker would."""
    queue = launch.max_prefill_queue_size
    return prompt_len <= launch.max_local_prefill_length or (
        queue is not None and prefill.credits.slots >= queue
    )


def blocks_for(ready: pr.Ready, positions: int) -> int:
    """KV blocks a worker needs for this many positions on every plane."""
    return ready.kv_planes * -(-positions // ready.block_size)


def route(
    launch: LaunchConfig,
    prompt_len: int,
    decodes: list[WorkerProc],
    prefills: list[WorkerProc] | None,
    keys,
) -> tuple[WorkerProc, WorkerProc | None]:
    """(decode or unified worker, prefill worker or None) for a request: the decode worker most
    likely to hold its prompt's prefix (keys: its full blocks' prefix-cache keys, or None), else the
    least loaded; in PD (prefills given), a prefill worker too unless the decode worker prefills it
    (a short prompt, or full prefill queues). The worker that computes the prompt will hold its
    blocks: it is told so."""
    pd = prefills is not None
    d = least_loaded(decodes) if pd or not keys else by_prefix(decodes, keys)
    prefill = None
    if pd:
        remote = lambda w: not prefill_locally(launch, prompt_len, w)  # noqa: E731
        prefill = by_prefix(prefills, keys, remote) if keys else least_loaded(prefills)
        prefill = prefill if remote(prefill) else None
    if keys and (prefill or not pd):
        remember(prefill or d, keys)
    return d, prefill
