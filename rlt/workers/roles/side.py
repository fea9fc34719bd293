"""The interface of a worker's role-specific part (Side), as the loop (rlt/workers/worker.py)
drives it, and the unified role's part: the engine alone serves its requests, so it holds nothing
and each hook does nothing or what the engine needs."""

from rlt.contract import protocol as pr


class Side:
    """A worker's role: constructed with the worker's engine, its Outbox, its KV transport (None
    on a unified worker) and the transfer timeout. Per loop iteration the loop calls handle() for
    each control message it does not handle itself (Add, Abort, Shutdown), stepped() with the
    engine's step outputs, fail() for requests the engine failed, then, after the step's Outputs
    message, progress(); busy() and queued() say what the side holds."""

    def __init__(self, engine, outbox, transport, transfer_timeout: float):
        self.engine, self.outbox, self.transport = engine, outbox, transport
        self.transfer_timeout = transfer_timeout

    def handle(self, msg) -> None:
        """A control message of the role's (Connect: the peers a KV transport writes to)."""
        if isinstance(msg, pr.Connect):
            for peer in msg.peers:
                self.transport.add_peer(peer)

    def abort(self, gen: int) -> None:
        """Drop what the side holds of `gen` (the loop then aborts it in the engine)."""

    def stepped(self, outs: list) -> None:
        """The engine's step outputs (StepOutput), before they go out."""

    def fail(self, gen: int, error: str) -> None:
        """Fail `gen` (its grammar did not compile): free it, then tell the coordinator."""
        self.engine.abort(gen)
        self.outbox.fail(gen, error)
        self.outbox.changed = True

    def progress(self) -> None:
        """After the step's Outputs: move what the side waits on (KV transfers), reply to it."""

    def busy(self) -> bool:
        """Work the side holds outside the engine (the loop then polls for messages every 1 ms,
        not every 50)."""
        return False

    def queued(self) -> int:
        """Requests waiting in the side for blocks (counted running in the stats)."""
        return 0
