"""One request inside a worker's engine: its tokens, the positions whose KV is final, the rows it
has in flight, and what it needs next.

A request holds blocks for the positions it has reached, not for prompt + max_tokens. When the pool
runs out the engine preempts one (sequence.preempt) and frees its blocks; resumed, it recomputes
its KV: the prompt at max_loops, then each generated position at the depth its token exited at
(`replay` groups: single rows, no sampling), so every plane holds what it held before and the
stream goes on exactly as if nothing had happened. Its full blocks of final positions go to the
prefix cache (rlt/workers/prefix_cache.py) under keys of their tokens and depths; admitted or
resumed, it starts after the longest cached prefix of the positions it knows.
"""

from dataclasses import dataclass, field

from rlt.contract.sampling_params import ResolvedParams
from rlt.workers.group import Group
from rlt.workers.kv_pool import BlockTables
from rlt.workers.prefix_cache import chain, prompt_keys
from rlt.workers.prompt_logprobs import targets
from rlt.workers.speculation import Acceptance, SpecRound


# (one request each: list membership by identity, not by comparing every field)
@dataclass(eq=False)
class Sequence:
    request_id: int
    prompt: list[int]
    params: ResolvedParams
    order: tuple  # (priority, arrival): admitted in this order, preempted in the reverse
    tables: BlockTables | None = None
    output: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)  # the depth each output token exited at
    num_done: int = 0  # positions whose KV is final on every plane
    group: Group | None = None  # its prompt chunk or decode token in flight
    # resumed: generated positions being recomputed
    replay: list[Group] = field(default_factory=list)
    replay_next: int = 0  # the next generated position to recompute
    # prefill worker: stop after the first token, keep the blocks for transfer
    prefill_only: bool = False
    feed: tuple | None = None  # its last sampled token, not read back yet: (PendingTokens, index)
    root: bytes = b""  # its prefix-cache key chain's root
    keys: list[bytes] = field(default_factory=list)  # prefix-cache keys of its first full blocks
    num_cached_blocks: int = 0  # leading blocks of its tables that the prefix cache has seen
    num_cached_tokens: int | None = None  # prompt positions found cached at its first admission
    hits: tuple | None = None  # its last prefix lookup: ((cache version, positions), cached blocks)
    # while running, penalized: its slot of penalty state (rlt/workers/penalties.py)
    slot: int | None = None
    listed: int = 0  # its prompt's distinct tokens (the first entries of that slot's token list)
    # asked for: per prompt position so far (rlt/workers/prompt_logprobs.py)
    prompt_logprobs: list | None = None
    matcher: object | None = None  # structured output: its Constraint, once its grammar is compiled
    speculation: tuple[int, int] | None = None  # (draft loops, tokens) where it may speculate
    spec: SpecRound | None = None  # its speculation round under way (rlt/workers/speculation.py)
    acceptance: Acceptance = field(default_factory=Acceptance)  # ... and whether rounds pay for it

    @property
    def in_flight(self) -> list[Group]:
        """Its groups in the next pass: its prompt chunk, decode token or draft, positions it
        recomputes, or its verify rows."""
        if self.group is not None:
            return [self.group]
        return self.spec.flying if self.spec is not None and self.spec.flying else self.replay

    def take(self, new: list[Group]) -> None:
        """Its next rows (next_groups') go in flight."""
        if new[0].exit_depth is not None:
            self.replay += new
        elif new[0].verify_of is not None:
            new[0].verify_of.flying = new
        else:
            self.group = new[0]

    @property
    def decoding(self) -> bool:
        return self.num_done >= len(self.prompt)

    @property
    def max_positions(self) -> int:
        """Positions it can ever store: a request needing more than the pool holds can never run."""
        return len(self.prompt) + (0 if self.prefill_only else self.params.max_tokens)

    @property
    def admit_positions(self) -> int:
        """Positions it holds from admission: its prompt, every generated position to recompute,
        and the position its next token is computed at."""
        if self.prefill_only:
            return len(self.prompt)
        return min(len(self.prompt) + max(len(self.output), 1), self.max_positions)

    @property
    def replay_end(self) -> int:
        """Positions whose KV is final once every generated position has been recomputed."""
        return len(self.prompt) + len(self.output) - 1

    @property
    def known_positions(self) -> int:
        """Positions whose token and depth are known: the prompt's, and each generated position
        whose token has been sampled from it."""
        return len(self.prompt) + max(len(self.output) - 1, 0)

    def block_keys(self, positions: int, depth: int, block_size: int) -> list[bytes]:
        """Prefix-cache keys of its full blocks within the first `positions` (<= known_positions):
        prompt positions ran at `depth`, generated position P + i to depths[i + 1]."""
        P = len(self.prompt)
        if len(self.keys) < min(positions, P) // block_size:  # whole prompt blocks: at once
            parent = self.keys[-1] if self.keys else self.root
            self.keys += prompt_keys(
                parent, self.prompt[:positions], depth, block_size, len(self.keys)
            )
        while (len(self.keys) + 1) * block_size <= positions:
            lo, hi = len(self.keys) * block_size, (len(self.keys) + 1) * block_size
            tokens = [self.prompt[i] if i < P else self.output[i - P] for i in range(lo, hi)]
            depths = [depth if i < P else self.depths[i - P + 1] for i in range(lo, hi)]
            self.keys.append(chain(self.keys[-1] if self.keys else self.root, tokens, depths))
        return self.keys[: positions // block_size]

    def next_groups(
        self, budget: int, chunk: int, coda: bool = False, speculate: bool = False
    ) -> list[Group]:
        """Its rows for the next pass, at most `budget`: a prompt chunk (at most `chunk` rows),
        positions to recompute, or its next decode token, draft or verify rows. Empty while it must
        wait. coda: the family runs a coda over boundary K/V after the loop (Huginn); speculate: a
        new speculation round may start."""
        s, p = self, self.params
        if not s.decoding:
            ids = s.prompt[s.num_done : s.num_done + min(chunk, budget)]
            last = s.num_done + len(ids) == len(s.prompt)
            asks = s.needs_whole_prompt  # its prompt logprobs: the tokens its rows predict
            return [
                Group(
                    ids,
                    s.num_done,
                    s.tables,
                    p,
                    False,
                    samples=last and not s.output,
                    output_index=0,
                    prompt_targets=targets(s.prompt, s.num_done, len(ids)) if asks else None,
                    matcher=s.matcher,
                    **s.penalty,
                )
            ]
        # resumed: generated position P + i took output[i] and ran to depths[i + 1]
        if s.num_done < s.replay_end:
            # at most `chunk` positions in flight: under SHARED (chunk 1) each position must be
            # final
            # before the next reads it, as when it was first computed
            P, start = len(s.prompt), max(s.replay_next, s.num_done)
            end = min(s.replay_end, start + budget, start + chunk - len(s.replay))
            # a position's coda reads every earlier one's coda K/V: no position may exit before an
            # earlier one
            if coda:
                # passes to the last exit in flight
                last = max((g.exit_depth - g.depth for g in s.replay), default=0)
                for i in range(start, end):
                    if s.depths[i - P + 1] < last:
                        end = i
                        break
                    last = s.depths[i - P + 1]
            s.replay_next = end
            return [
                Group(
                    [s.output[i - P]],
                    i,
                    s.tables,
                    p,
                    True,
                    False,
                    0,
                    exit_depth=s.depths[i - P + 1],
                )
                for i in range(start, end)
            ]
        if s.replay or (
            s.feed is not None and (s.prefill_only or len(s.output) + 1 >= p.max_tokens)
        ):
            # still recomputing; or that token ends it (or hands it off): nothing to decode here
            return []
        base = len(s.output) + (s.feed is not None)
        # (a grammar waiting for `after`: plain)
        if s.spec is None and speculate and (s.matcher is None or s.matcher.started):
            s.spec = s.new_round(base)
        if s.spec is not None:
            return s.spec_groups(budget)
        return [
            Group(
                [0] if s.feed is not None else [s.output[-1]],
                s.num_done,
                s.tables,
                p,
                True,
                samples=True,
                output_index=len(s.output) + (s.feed is not None),
                feed=s.feed,
                matcher=s.matcher,
                **s.penalty,
            )
        ]

    def new_round(self, base: int) -> SpecRound | None:
        """A speculation round from its first position not yet final (draft 0 predicting output
        `base`), where its request speculates and drafting pays now."""
        p = self.params
        if self.speculation is None or base < self.acceptance.pause_until:
            return None
        d, most = self.speculation  # n drafts checked: n + 1 rows, up to n + 1 tokens a round
        n = self.acceptance.drafts(most, d, p.max_loops)
        k = min(n + 1, p.max_tokens - base)
        return SpecRound(self.num_done, base, k, d) if k >= 2 else None

    def spec_groups(self, budget: int) -> list[Group]:
        """Its round's next draft, or its verify rows once every draft is out (none while the verify
        runs or its tokens are on their way back)."""
        s, r = self, self.spec
        if r.verified:
            return []
        j = len(r.drafts)
        if j < r.k:
            return [s._draft(r, j)]
        if budget < r.k:
            return []
        r.verified = True
        common = dict(
            tables=s.tables, params=s.params, decoding=True, samples=True, matcher=s.matcher
        )
        return [
            Group(
                [0],
                g.start,
                output_index=r.base + i,
                depth=r.loops,
                inject=g.inject,
                state=g.state,
                verify_of=r,
                **common,
            )
            for i, g in enumerate(r.drafts)
        ]

    def _draft(self, r: SpecRound, j: int) -> Group:
        """Draft j of round r: its input is draft j - 1's token (on the device while it is not
        back: the feed), or for draft 0 the last output token."""
        ids = [0] if self.feed is not None else [r.tokens[j - 1] if j else self.output[-1]]
        return Group(
            ids,
            r.start + j,
            self.tables,
            self.params,
            True,
            samples=j + 1 < r.k,  # (the last one's token is checked by nothing: no head)
            output_index=r.base + j,
            feed=self.feed,
            matcher=self.matcher,
            draft_of=r,
        )

    @property
    def needs_whole_prompt(self) -> bool:
        """Its prompt logprobs are asked for and not out yet (they go with its first token): every
        prompt position must run, no prefix-cache hit (as vLLM)."""
        return self.prompt_logprobs is not None and not self.output

    @property
    def penalty(self) -> dict:
        """Its groups' view of its penalty state."""
        return {"slot": self.slot, "listed": self.listed}

    def replayed(self, g: Group) -> None:
        """A recomputed position is final; once all are, decoding goes on."""
        self.replay.remove(g)
        if not self.replay and self.replay_next >= self.replay_end:
            self.num_done = self.replay_end

    def preempt(self) -> BlockTables | None:
        """Drop its rows in flight and hand back its blocks: resumed, it recomputes from position 0."""
        tables, self.tables = self.tables, None
        self.group, self.replay, self.num_done, self.replay_next, self.num_cached_blocks = (
            None,
            [],
            0,
            0,
            0,
        )
        if self.spec is not None and self.matcher is not None:
            self.matcher.end_round()
        self.spec = None
        return tables
