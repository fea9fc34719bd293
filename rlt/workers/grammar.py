"""A worker's side of structured output (rlt/contract/grammar.py): grammars compile off the
worker's loop, in its compile processes (rlt/workers/grammar_compile.py), cached by spec; a request
waits in the scheduler until its grammar is ready (as vLLM), and its compile is abandoned if it
goes first.
Each constrained request then has a matcher (Constraint) that accepts its output tokens in order.
Its next decode row starts before its last token is read back, like any other (the row's loops
need only the token on the device); its mask is needed only when the row leaves the loop, by which
time the engine has read that token back, unless the row exits in its first pass: then that one
token is read at once (mask_fields). Constrained requests keep the regular path, not steady decode
(the host fills each mask). A PD decode worker's matcher starts by accepting the prefill worker's
first token; a preempted request keeps its matcher (its outputs do not change), and prefix-cache
hits do not touch it (outputs only). A grammar that waits for a token sequence (`after`: the end of
the reasoning) masks nothing until the outputs hold it; the outputs after it go through the matcher
(as vLLM's structured-output manager, which starts the matcher once the reasoning has ended). The
matcher replays outputs, so a decode worker, or a prefill worker's first token, finds the same state.
"""

from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, wait

import numpy as np

MAX_CACHED = 512  # compiled grammars a worker keeps (least recently used out)


class Constraint:
    """One request's matcher over the model's whole vocabulary."""

    def __init__(self, compiled, outputs: list[int], after: tuple[int, ...] = ()):
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        # [1, ceil(V / 32)] int32
        self.mask = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
        self.ended = False
        self.accepted = 0  # output tokens accepted
        # the ids the grammar waits for; the last outputs before
        self.after, self.tail = tuple(after), ()
        # the grammar constrains the outputs after `after` (none yet: any token)
        self.started = not after
        # a speculation round's (ended before it, drafts taken), accepts
        self.round, self.steps = None, 0
        for i, t in enumerate(outputs):
            self.accept(t, i)

    def fill(self) -> np.ndarray:
        """The bitmask of the tokens the next output may be (bit t % 32 of word t // 32). Once the
        grammar has ended, any (the request ends with the token already read: this one is dropped)."""
        if self.ended:
            self.mask.fill_(-1)
        else:
            self.matcher.fill_next_token_bitmask(self.mask, 0)
        return self.mask.numpy()[0]

    def accept(self, token: int, index: int) -> bool:
        """Advance by output `index` (once: a token read early for a mask comes again when the engine
        reads it); -> whether the grammar has ended (terminated: it took a stop token; or it refused
        the token, which its mask did not allow: never, unless the mask was off)."""
        if index == self.accepted and not self.ended:
            self.accepted += 1
            if not self.started:  # (the token that completes `after` is no grammar's)
                self.tail = (self.tail + (token,))[-len(self.after) :]
                self.started = self.tail == self.after
            else:
                self.ended = not self.matcher.accept_token(token) or self.matcher.is_terminated()
        return self.ended

    def round_mask(self, g) -> np.ndarray:
        """A speculation round's row (draft or verify j, rlt/workers/speculation.py): the bitmask after
        the round's drafts 0..j - 1, which the matcher takes for the round (end_round gives them
        back); a draft token still on the device is read now (the draft before it exited last pass)."""
        r = g.draft_of or g.verify_of
        j = g.start - r.start
        if j not in r.masks:
            if self.round is None:  # the round's first mask: every output before it taken first
                if self.accepted < r.base:
                    pending, row = (r.drafts[0] if r.drafts else g).feed
                    self.accept(int(pending.tokens[row]), r.base - 1)
                self.round = (self.ended, 0)
            while self.round[1] < j:
                i = self.round[1]
                if i not in r.tokens:  # (its draft row was fed that token: one unread at most)
                    pending, row = r.drafts[i + 1].feed if i + 1 < len(r.drafts) else g.feed
                    r.tokens[i] = int(pending.tokens[row])
                if not self.ended:
                    ok = self.matcher.accept_token(r.tokens[i])
                    self.steps += ok
                    self.ended = not ok or self.matcher.is_terminated()
                self.round = (self.round[0], i + 1)
            r.masks[j] = self.fill().copy()
        return r.masks[j]

    def end_round(self) -> None:
        """Give back what a speculation round's drafts advanced (their tokens come again as outputs)."""
        if self.round is not None:
            if self.steps:
                self.matcher.rollback(self.steps)
            self.ended, self.round, self.steps = self.round[0], None, 0

    def catch_up(self, g) -> None:
        """A row sampling output g.output_index while the token before it is still on the device
        (its row exits in its first pass): read that token now."""
        if self.accepted < g.output_index:
            assert g.feed is not None and self.accepted == g.output_index - 1, (
                "one token unread at most"
            )
            pending, i = g.feed
            self.accept(int(pending.tokens[i]), g.output_index - 1)


class WorkerGrammars:
    """The worker's compiled grammars: a cache of futures by spec (MAX_CACHED, least recently used
    out), filled by the compile pool (rlt/workers/grammar_compile.py)."""

    def __init__(self, mc, cfg):
        self.mc, self.cfg = mc, cfg
        self.pool = None  # CompilePool
        self._compiled: OrderedDict[tuple[str, str], Future] = OrderedDict()
        # specs submitted, not done (a set lookup per waiting request)
        self._compiling: set[tuple[str, str]] = set()
        # requests whose grammar did not compile -> error (the worker fails them)
        self.failed: dict[int, str] = {}

    def ready(self, s) -> bool:
        """Can the request run (its matcher built, or it has no grammar)? Starts its compile."""
        spec = s.params.structured_output
        if spec is None or s.matcher is not None:
            return True
        if spec in self._compiling:
            return False
        future = self._compiled.get(spec)
        if future is None:
            future = self._compiled[spec] = self.start().submit(spec)
            self._compiling.add(spec)
            # (the dispatcher's thread)
            future.add_done_callback(lambda _: self._compiling.discard(spec))
            while len(self._compiled) > MAX_CACHED:
                self._compiled.popitem(last=False)
            if not future.done():
                return False
        self._compiled.move_to_end(spec)
        if future.exception() is not None:
            self.failed.setdefault(s.request_id, str(future.exception()))
            return False
        s.matcher = Constraint(future.result(), s.output, s.params.grammar_after)
        return True

    def start(self):
        """The compile pool, this process's for the model (a GPU worker starts it, grown to all its
        processes, beside its warm-up; otherwise the first constrained request does)."""
        if self.pool is None:
            from rlt.workers.grammar_compile import CompilePool

            self.pool = CompilePool.shared(
                self.mc, self.cfg.grammar_compile_processes, self.cfg.grammar_compile_timeout
            )
        return self.pool

    def keep(self, waiting) -> None:
        """Abandon the compiles no waiting request needs any more (its requests aborted or failed):
        their processes are killed, their memory returned."""
        if self._compiling:
            wanted = {s.params.structured_output for s in waiting if s.matcher is None}
            for spec in self._compiling - wanted:
                if (future := self._compiled.pop(spec, None)) is not None:
                    self.pool.cancel(spec, future)

    def take_failed(self) -> list[tuple[int, str]]:
        """(request, error) of each request whose grammar did not compile, once."""
        failed, self.failed = list(self.failed.items()), {}
        return failed

    def wait(self, seconds: float) -> None:
        """Nothing else to run: let a compile finish (rather than spin against its process)."""
        compiling = [f for f in self._compiled.values() if not f.done()]
        if compiling:
            wait(compiling, seconds, return_when=FIRST_COMPLETED)

    def stuck(self) -> str | None:
        return None if self.pool is None else self.pool.stuck()

    @staticmethod
    def accept(s, token: int) -> bool:
        """A request's token read back (already appended to its output): -> whether its grammar has ended."""
        return s.matcher is not None and s.matcher.accept(token, len(s.output) - 1)


def mask_fields(groups: list) -> dict:
    """The constrained sampled rows' bitmasks, as step fields (empty: no row is constrained). A row
    whose grammar waits for `after` has no mask (its token before may have completed it: read first)."""
    rows = [i for i, g in enumerate(groups) if g.matcher is not None]
    spec = {i for i in rows if groups[i].draft_of is not None or groups[i].verify_of is not None}
    for i in rows:
        if i not in spec:
            groups[i].matcher.catch_up(groups[i])
    rows = [i for i in rows if groups[i].matcher.started]
    if not rows:
        return {}
    masks = [
        groups[i].matcher.round_mask(groups[i]) if i in spec else groups[i].matcher.fill()
        for i in rows
    ]
    return {"gm_row": np.array(rows), "gm_mask": np.stack(masks)}
