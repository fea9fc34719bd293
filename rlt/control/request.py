"""A request as the coordinator holds it: its phase (rlt/control/lifecycle.py names each) and the
credits it holds on its workers."""

import enum
from dataclasses import dataclass

from rlt.contract.sampling_params import ResolvedParams
from rlt.control.collector import Collector
from rlt.control.worker_proc import WorkerProc


class Phase(enum.Enum):
    QUEUED = "queued"
    WAITING = "waiting"
    RESERVED = "reserved"
    PREFILLING = "prefilling"
    TRANSFERRING = "transferring"
    DECODING = "decoding"


@dataclass
class Holding:
    """Credits one request holds on one worker; released exactly once."""

    worker: WorkerProc
    blocks: int
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.worker.credits.give(self.blocks)


@dataclass
class Request:
    request_id: str
    gen: int
    collector: Collector
    prompt: list[int]
    params: ResolvedParams
    priority: int
    decode: Holding | None = None  # the unified or decode worker (None while QUEUED)
    prefill: Holding | None = None  # PD, prefilled on a prefill worker
    phase: Phase = Phase.QUEUED
    retired: bool = False  # gone from the user's view; resources may still be returning
    # its stream was dropped unfinished: an abort is queued (control/stream.py)
    abandoned: bool = False
    first_token: int | None = None

    @property
    def writer_done(self) -> bool:
        """No prefill worker can still write into the decode worker's blocks."""
        return self.prefill is None or self.prefill.released
