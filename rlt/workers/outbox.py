"""What a worker sends its coordinator, through its one socket (the loop, rlt/workers/worker.py,
reads the same socket): replies as they happen, failed requests, and each step's Outputs with what
changed since the last one (the prompts a prefill worker accepted; the stats, when anything moved).
"""

from rlt.contract import protocol as pr


class Outbox:
    def __init__(self, sock):
        self.sock = sock
        self.changed = False  # something the stats show moved: an Outputs message is due
        self.started: list[int] = []  # prefill: generations accepted since the last Outputs

    def send(self, msg) -> None:
        self.sock.send(pr.encoder.encode(msg))

    def fail(self, gen: int, error: str) -> None:
        """Tell the coordinator a request failed (whoever fails it has freed what it held)."""
        self.send(pr.Failed(gen, error))

    def outputs(self, tokens: list, stats: pr.Stats, cache: pr.CacheEvents | None) -> None:
        """A step's Outputs, with the prompts started since the last one."""
        self.send(pr.Outputs(tokens, stats, self.started, cache))
        self.started = []
