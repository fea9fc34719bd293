"""A request's lifecycle: the one place its states are named.

single:  WAITING -> DECODING (the unified worker prefills and decodes) -> finished
PD:      WAITING (decode worker reserving blocks) -> RESERVED (blocks granted, Prefill sent) ->
         PREFILLING (the prefill worker computes and writes each chunk into the decode worker's
         blocks) -> TRANSFERRING (first token streamed; last writes in flight) -> DECODING (the
         decode worker owns it) -> finished
PD, prefilled locally (conditional disaggregation: a short prompt, or a busy prefill worker):
         WAITING -> DECODING on the decode worker, as single

A request leaves the user's view (its id reusable) at once on finish, abort or failure; its
resources are released in writer-before-reader order: a decode worker's reserved blocks are freed
only after the prefill worker confirmed that no write into them is in flight (TransferDone,
Drained, or its death).
"""

import enum
from dataclasses import dataclass, field


class Phase(enum.Enum):
    WAITING = "waiting"
    RESERVED = "reserved"
    PREFILLING = "prefilling"
    TRANSFERRING = "transferring"
    DECODING = "decoding"


@dataclass
class Credits:
    """What the coordinator has assigned to a worker and not yet seen released."""

    blocks: int = 0
    slots: int = 0

    def take(self, blocks: int) -> None:
        self.blocks += blocks
        self.slots += 1

    def give(self, blocks: int) -> None:
        self.blocks -= blocks
        self.slots -= 1


@dataclass
class Holding:
    """Credits one request holds on one worker; released exactly once."""

    worker: object
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
    collector: object
    prompt: list[int]
    params: object
    priority: int
    phase: Phase = Phase.WAITING
    retired: bool = False  # gone from the user's view; resources may still be returning
    first_token: int | None = None
    decode: Holding | None = None  # the unified or decode worker
    prefill: Holding | None = None
    timings: dict = field(default_factory=dict)
