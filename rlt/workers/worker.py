"""The worker's main loop: control messages in, one engine step, one Outputs message out. What
differs by role (a prefill worker posts KV writes and reports them done, a decode worker reserves
blocks, counts chunk notifications and activates) is the role's Side (rlt/workers/roles/); what
the worker sends goes through its Outbox (rlt/workers/outbox.py)."""

from rlt.contract import protocol as pr
from rlt.errors import RequestError
from rlt.workers.outbox import Outbox
from rlt.workers.roles import ROLES


class Worker:
    def __init__(self, sock, engine, role: str, transport, transfer_timeout: float):
        """sock: the coordinator's (messages in; out through the Outbox); transport: the KV
        transport (prefill and decode roles), None on a unified worker."""
        self.sock, self.engine, self.role = sock, engine, role
        self.outbox = Outbox(sock)
        self.side = ROLES[role](engine, self.outbox, transport, transfer_timeout)
        self.counters = c = engine.counters
        self.first_use_at_ready = (c.captures, c.compiles)  # (built when READY is sent)
        c.ready = True

    def stats(self) -> pr.Stats:
        e, prefix, c = self.engine, self.engine.pool.prefix, self.counters
        return pr.Stats(
            len(e.running) + len(e.held) + len(e.reserved) + self.side.queued(),
            len(e.waiting),
            e.num_free_blocks,
            e.preemptions,
            c.captures - self.first_use_at_ready[0],
            c.compiles - self.first_use_at_ready[1],
            prefix.queried_tokens if prefix is not None else 0,
            prefix.hit_tokens if prefix is not None else 0,
            e.pool.num_cached,
            e.spec_rounds,
            e.spec_drafts,
            e.spec_accepted,
        )

    def cache_events(self) -> pr.CacheEvents | None:
        """The prefix cache's inserts and evictions since the last message, if watched (a few bytes
        a block: the coordinator has the tokens)."""
        prefix = self.engine.pool.prefix
        events = prefix.take_events() if prefix is not None and prefix.stored is not None else None
        return pr.CacheEvents(*events) if events is not None else None

    def busy(self) -> bool:
        return self.engine.has_work() or self.side.busy()

    def handle(self, msg) -> bool:
        """A control message: the engine's own (Add, Abort), the loop's (Shutdown: -> False), else
        the role's."""
        self.outbox.changed = True
        if isinstance(msg, pr.Add):
            try:
                self.engine.add_request(msg.gen, msg.prompt, msg.params, msg.priority)
            except RequestError as err:
                self.outbox.fail(msg.gen, str(err))
        elif isinstance(msg, pr.Abort):
            for gen in msg.gens:
                self.side.abort(gen)
                self.engine.abort(gen)
        elif isinstance(msg, pr.Shutdown):
            return False
        else:
            self.side.handle(msg)
        return True

    def run(self) -> None:
        engine, side, outbox, counters = self.engine, self.side, self.outbox, self.counters
        while True:
            outbox.changed = False
            counters.progress += 1
            counters.busy = self.busy()
            timeout = 0 if engine.has_work() else (1 if counters.busy else 50)
            while self.sock.poll(timeout):
                timeout = 0
                if not self.handle(pr.to_worker.decode(self.sock.recv())):
                    return
            tokens = []
            if engine.has_work():
                outs = engine.step()
                tokens = [
                    pr.Token(
                        o.request_id,
                        o.token_id,
                        o.exit_depth,
                        o.logprobs,
                        o.finish_reason,
                        o.num_cached_tokens,
                        o.prompt_logprobs,
                    )
                    for o in outs
                ]
                side.stepped(outs)
                for gen, error in engine.grammars.take_failed():
                    side.fail(gen, error)
            cache = self.cache_events()
            if tokens or outbox.changed or cache:  # the first token streams before its KV moves
                outbox.outputs(tokens, self.stats(), cache)
            outbox.changed = False
            side.progress()
            if outbox.changed or (cache := self.cache_events()):
                outbox.send(pr.Outputs([], self.stats(), cache=cache))
