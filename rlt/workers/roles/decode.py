"""The decode role's part: a Reserve takes blocks for a prompt prefilled elsewhere (first come,
first served: a Reserve that does not fit waits for blocks); the prefill worker's KV writes land
in them, each announced by a "gen:seq" notification; the coordinator's Activate, once every chunk
it names has arrived, hands the request to the engine to decode. A transfer that does not finish
within the timeout after the Activate fails its request."""

import time
from dataclasses import dataclass, field

from rlt.contract import protocol as pr
from rlt.errors import RequestError
from rlt.workers.roles.side import Side


@dataclass
class _Incoming:
    """A reservation waiting for its chunks and the coordinator's Activate."""

    seqs: set = field(default_factory=set)
    activate: pr.Activate | None = None
    deadline: float = 0.0


class DecodeSide(Side):
    def __init__(self, engine, outbox, transport, transfer_timeout: float):
        super().__init__(engine, outbox, transport, transfer_timeout)
        self.incoming: dict[int, _Incoming] = {}
        self.pending_reserves: list[pr.Reserve] = []

    def handle(self, msg) -> None:
        if isinstance(msg, pr.Reserve):
            self.pending_reserves.append(msg)
            self._try_reserve()
        elif isinstance(msg, pr.Activate):
            inc = self.incoming.get(msg.gen)
            if inc is not None:  # else: aborted meanwhile
                inc.activate, inc.deadline = msg, time.monotonic() + self.transfer_timeout
                self._try_activate(msg.gen)
        else:
            super().handle(msg)

    def abort(self, gen: int) -> None:
        self.incoming.pop(gen, None)
        self.pending_reserves = [r for r in self.pending_reserves if r.gen != gen]

    def busy(self) -> bool:
        return bool(self.incoming or self.pending_reserves)

    def queued(self) -> int:
        return len(self.pending_reserves)

    def progress(self) -> None:
        """Count the notifications that arrived, activate what is complete, fail what is late."""
        for gen, seq in self.transport.notifications():
            inc = self.incoming.get(gen)
            if inc is not None:  # notifications of retired generations are dropped
                inc.seqs.add(seq)
                self._try_activate(gen)
        now = time.monotonic()
        for gen, inc in list(self.incoming.items()):
            if inc.activate is not None and now > inc.deadline:
                # The prefill worker reported every write done, so none can still land: free.
                del self.incoming[gen]
                self.engine.abort(gen)
                self.outbox.changed = True
                self.outbox.fail(
                    gen,
                    f"KV transfer incomplete: {len(inc.seqs)} of {inc.activate.chunks} "
                    f"chunks arrived within {self.transfer_timeout} s",
                )
        if self.pending_reserves:
            self._try_reserve()

    def _try_reserve(self) -> None:
        while self.pending_reserves:
            r = self.pending_reserves[0]
            try:
                tables = self.engine.reserve(r.gen, r.prompt_len, r.max_tokens)
            except RequestError as err:
                self.pending_reserves.pop(0)
                self.outbox.fail(r.gen, str(err))
                continue
            if tables is None:
                return  # FCFS: wait for blocks
            self.pending_reserves.pop(0)
            self.incoming[r.gen] = _Incoming()
            self.outbox.send(pr.Reserved(r.gen, tables.planes))
            self.outbox.changed = True

    def _try_activate(self, gen: int) -> None:
        inc = self.incoming[gen]
        a = inc.activate
        if a is not None and inc.seqs >= set(range(a.chunks)):
            del self.incoming[gen]
            self.engine.activate(gen, a.prompt, a.params, a.first_token, a.priority)
