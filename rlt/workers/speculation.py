"""Looped self-speculation: a request's first d loops draft its next k tokens, its remaining loops
verify them in one go.

A round starts at position P (its input: the last output token). Draft j (j < k) is one row at
position P + j run to depth d; the family's head on its depth-d state, sampled with the noise of
output index base + j, gives the draft token, which is draft j + 1's input (taken on the device, as
a decode row's token is). The drafts' states and their KV at depths 1..d are exactly what the full
depth computes for those loops, so the verify goes on from there: k rows at positions P..P + k - 1
(one group each, in one pass: a row's keys and values are stored before any row of the pass
attends) run loops d + 1..D and are sampled with the same noise, writing their KV at depths
d + 1..D. Target j is what a plain run samples at index base + j as long as drafts 0..j - 1 equal
targets 0..j - 1: the round outputs the targets up to and including the first that differs from
its draft (at least one token, at most k). Positions past the last output's stay unfinished: the
next round writes them again before anything reads them. So a speculative stream equals a plain
one token for token, greedy or sampled, with the same exit depths (every token at max_loops) and
logprobs (the targets').

Structured output masks a round's row j, draft and verify alike, by the grammar's state after
drafts 0..j - 1 (taken by the matcher for the round, rolled back when its verify is back): the
only state in which target j counts.

Where it runs: decode tokens at a fixed depth (no early exit, whose depths a draft cannot know),
with no penalties (whose counts would take the drafts' tokens), on a LAST_EXITED pool. The
scheduler starts rounds only while few requests decode (speculative_max_streams): past that a pass
of more rows is no longer free; and a request whose drafts do not pay stops drafting for a while
(Acceptance).
"""

from dataclasses import dataclass, field


@dataclass(eq=False)
class SpecRound:
    start: int  # position of draft 0 (its input: the last output token)
    base: int  # output index of the token draft 0 predicts
    # drafts (and verify rows): the first k - 1 drafts' tokens are checked, the last one's none
    k: int
    loops: int  # d: the drafts' depth
    # exited draft groups, in order (their depth-d states)
    drafts: list = field(default_factory=list)
    tokens: dict[int, int] = field(default_factory=dict)  # draft j -> its token, once on the host
    flying: list = field(default_factory=list)  # the verify groups while they run
    verified: bool = False  # the verify has been scheduled
    # verify row j -> (token, logprobs), as they come back
    targets: dict = field(default_factory=dict)
    # structured output: row j -> its bitmask (draft and verify)
    masks: dict = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        """Every target and draft token is on the host."""
        return len(self.targets) == self.k and all(j in self.tokens for j in range(self.k - 1))

    @property
    def matched(self) -> int:
        """Drafts equal to their targets before the first that differs (of k - 1 checked)."""
        differ = (j for j in range(self.k - 1) if self.tokens[j] != self.targets[j][0])
        return next(differ, self.k - 1)

    def accepted(self) -> list[tuple[int, dict | None]]:
        """The targets the round outputs: up to and including the first that differs from its
        draft."""
        out = []
        for j in range(self.k):
            out.append(self.targets[j])
            if j + 1 < self.k and self.tokens[j] != self.targets[j][0]:
                break
        return out


def speculation(params, cfg) -> tuple[int, int] | None:
    """(d, n: the most draft tokens a round checks) for a request on an engine of config cfg, or
    None where it does not speculate (see the module's doc)."""
    d = cfg.speculative_loops if params.speculative_loops is None else params.speculative_loops
    n = cfg.speculative_tokens if params.speculative_tokens is None else params.speculative_tokens
    if not 1 <= d < params.max_loops or cfg.kv_layout != "last_exited":
        return None
    if params.exits_early or params.exit_criterion != "gate" or params.penalized:
        return None
    return d, n


@dataclass
class Acceptance:
    """A request's recent acceptance, and what speculating pays for it: a round of n checked drafts
    at acceptance a outputs 1 + a + ... + a^n tokens on average for (n + 1) d + (D - d) loop passes,
    where plain decoding takes D a token. Each round checks the n (up to the request's) that gives
    the most tokens a loop pass at the recent acceptance (the first round checks one); where even
    the best does not pay (by a margin, for the drafts' heads and the round's host work), the
    request decodes plainly for a while (twice as long each time in a row), then probes again.
    (Loop passes, not bytes: weighing a verify row by the context's KV it reads measured slower at
    8K tokens, since the rows of a request read their context together.)"""

    checked: float = 0.0  # drafts checked and matched, decayed: recent rounds count most
    matched: float = 0.0
    pause_until: int = 0  # no round starts before the request has this many output tokens
    misses: int = 0

    DECAY = 0.75
    MARGIN = 1.15
    PAUSE = 8  # tokens, doubled per miss in a row
    MOST = 512

    def drafts(self, most: int, loops: int, depth: int) -> int:
        """The drafts the next round checks: the n <= most with the most tokens a loop pass (one
        while nothing is measured: a request's first round, or its first after a pause, is a cheap
        probe, so that drafts that never match cost little more than plain decoding)."""
        if not self.checked:
            return 1
        return max(range(1, most + 1), key=lambda n: self._gain(n, loops, depth))

    def _gain(self, n: int, loops: int, depth: int) -> float:
        """A round's loop passes saved over plain decoding's, as a ratio (> 1: faster)."""
        a = self.matched / self.checked
        return sum(a**j for j in range(n + 1)) * depth / ((n + 1) * loops + depth - loops)

    def update(self, checked: int, matched: int, most: int, loops: int, depth: int, outputs: int):
        self.checked = self.DECAY * self.checked + checked
        self.matched = self.DECAY * self.matched + matched
        if self._gain(self.drafts(most, loops, depth), loops, depth) >= self.MARGIN:
            self.misses = 0
            return
        self.pause_until = outputs + min(self.PAUSE << self.misses, self.MOST)
        self.misses += 1
        self.checked = self.matched = 0.0  # (a fresh estimate when it tries again)


def speculated(g) -> None:
    """A draft or verify group left the loop. A draft's depth-d state (and loop input) is kept for
    its verify row, copied: the pass's output is a CUDA graph's, which its next replay
    overwrites."""
    if g.draft_of is not None:
        g.state = g.state.clone()
        g.inject = None if g.inject is None else g.inject.clone()
        g.draft_of.drafts.append(g)
    else:
        r = g.verify_of
        r.flying = [f for f in r.flying if f is not g]


def round_back(engine, s, r: SpecRound) -> list:
    """Request s's round r is back from its verify: its grammar gives back the drafts, its
    acceptance takes the round in, and the targets it keeps are the request's next tokens (engine:
    the LoopEngine, which counts rounds and appends tokens), their positions final; the next round
    starts after them. -> the step's outputs."""
    if s.matcher is not None:
        s.matcher.end_round()
    d, most = s.speculation
    s.acceptance.update(r.k - 1, r.matched, most, d, s.params.max_loops, len(s.output) + r.k)
    engine.spec_rounds, engine.spec_drafts = engine.spec_rounds + 1, engine.spec_drafts + r.k - 1
    engine.spec_accepted += r.matched
    outputs = []
    for tok, top in r.accepted():
        outputs.append(engine.append_token(s, tok, s.params.max_loops, top))
        engine.spec_tokens += 1
        if outputs[-1].finish_reason is not None:
            return outputs
    if s.spec is r:  # (not preempted meanwhile: then it recomputes them)
        s.num_done, s.spec = r.start + len(outputs), None
    return outputs
