"""Routing: which worker of a role takes a request, and whether a PD request is prefilled by its
decode worker itself (conditional disaggregation, as NVIDIA Dynamo does)."""

from rlt import protocol as pr
from rlt.config import LaunchConfig
from rlt.control.worker_proc import WorkerProc


def least_loaded(workers: list[WorkerProc]) -> WorkerProc | None:
    """Most free blocks after credits, then fewest slots."""
    return max(workers, key=lambda w: (w.ready.kv_blocks_total - w.credits.blocks, -w.credits.slots), default=None)


def prefill_locally(launch: LaunchConfig, prompt_len: int, prefill: WorkerProc) -> bool:
    """A short prompt, or a prefill worker with a queue: the decode worker prefills the request as a
    unified worker would."""
    queue = launch.max_prefill_queue_size
    return prompt_len <= launch.max_local_prefill_length or (queue is not None and prefill.credits.slots >= queue)


def blocks_for(ready: pr.Ready, positions: int) -> int:
    """KV blocks a worker needs for this many positions on every plane."""
    return ready.kv_planes * -(-positions // ready.block_size)
