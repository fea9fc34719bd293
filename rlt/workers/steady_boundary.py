"""Steady decode for a family with boundary layers (Huginn: prelude -> core x r -> coda), exits by
its criteria (exit_criteria.py) or at fixed depth.

Each pass runs the core over every lane, then checks, on the device, the lanes that just finished a
loop their criterion is checked after (the logit criteria over the coda and head of every lane, as
the regular path runs them for its checked rows); a lane whose check holds (or that reached
max_loops) parks: it keeps its state and writes its K/V to the scratch block until a boundary pass.
A boundary pass takes every parked lane out at once, as the regular path's exit parking does
(exit_wait_passes): LAST_EXITED finalize copies, the coda (writing the position's boundary K/V) and
head over every lane, sampling, then the prelude of each exited lane's new token at the next
position (its boundary K/V) and its initial latent. The coda, head and prelude read their weights
whatever the row count, so a boundary pass costs about one more pass of the core: the host runs one
every exit_wait_passes passes, or as soon as it reads that every lane is parked (at fixed depth: on
the passes where lanes reach it).
"""

import torch

from rlt.contract.sampling_params import EXIT_CRITERIA
from rlt.kernels.sampler import top_logprobs
from rlt.workers.exit_criteria import LATENT, evaluate, initial_values
from rlt.workers.steady import SteadyDecode
from rlt.workers.step_buffers import DeviceReadback

CRITERIA = tuple(EXIT_CRITERIA)
RUN_AHEAD = 1  # passes launched past the newest whose flags the host has read (_read_parked)


class BoundarySteadyDecode(SteadyDecode):
    @torch.inference_mode()
    def __init__(self, runner, groups, exited: set[int]):
        """exited: ids of the groups whose last regular-path verdict was an exit (they park here)."""
        super().__init__(runner, groups)
        dev = runner.device
        # per lane: its criterion's index in CRITERIA, from 1 (0: fixed depth, no check)
        self.names = names = [p.exit_criterion if p.exits_early else None for p in self.params]
        self.crit = torch.tensor([CRITERIA.index(c) + 1 if c else 0 for c in names], device=dev)
        # Each criterion some lane has: its previous values over every lane
        # (exit_criteria.evaluate's
        # form; the other lanes' rows unused), from the groups' last checks, else the initial ones.
        self.prev = {c: self._initial(c, groups, names) for c in CRITERIA if c in names}
        self.parked = torch.tensor(
            [g.parked is not None or id(g) in exited for g in groups], device=dev
        )
        self.seeds = torch.tensor([p.state_seed for p in self.params], device=dev)
        # no logit criterion: each pass's bookkeeping and checks are one operation (lane_checks.py)
        self.latent_only = bool(self.prev) and all(c in LATENT for c in self.prev)
        self.wait, self.since = max(1, runner.exit_wait), 0
        # per pass since the last boundary pass: lanes neither parked nor ended, lanes parked
        self.flags: list[DeviceReadback] = []
        self.seen = (False, False)  # the newest of them the host has read

    def _initial(self, crit: str, groups: list, names: list) -> tuple[torch.Tensor, ...]:
        rows = []
        for i, (g, name) in enumerate(zip(groups, names)):
            last = g.criterion_prev if name == crit else None
            if crit in LATENT:  # the state at its last check, at first its initial latent
                rows.append(((self.x[i : i + 1] if last is None else last).float(),))
            elif last is None:
                rows.append(initial_values(crit, self.runner.mc.vocab_size, self.x.device))
            else:  # (a row of the values its last check stacked)
                rows.append(tuple(v[last[1] : last[1] + 1] for v in last[0]))
        return tuple(torch.cat(col) for col in zip(*rows))

    def _check(self, x: torch.Tensor, checked: torch.Tensor) -> torch.Tensor:
        """The lanes whose criterion holds after this loop, among those checked now (each
        criterion's evaluate over every lane, kept for its own); their previous values updated. The
        logit criteria's coda writes the checked lanes' boundary K/V (their exit's is the one kept)."""
        exits, logits = torch.zeros_like(checked), None
        for crit, prev in self.prev.items():
            mine = checked & (self.crit == CRITERIA.index(crit) + 1)
            if crit not in LATENT and logits is None:
                write = checked & (self.crit > len(LATENT))
                logits = self.model.head(x, *self._boundary(self.pos, write))
            hold, new = evaluate(crit, x if crit in LATENT else logits, prev, self.threshold)
            exits = exits | (mine & hold)
            self.prev[crit] = tuple(torch.where(_rows(mine, n), n, p) for n, p in zip(new, prev))
        return exits

    def _restart(self, lanes: torch.Tensor, state: torch.Tensor) -> None:
        """These lanes' new tokens start their criteria afresh: the initial latent, initial values."""
        for crit, prev in self.prev.items():
            first = (
                (state.float(),)
                if crit in LATENT
                else initial_values(crit, self.runner.mc.vocab_size, state.device)
            )
            self.prev[crit] = tuple(torch.where(_rows(lanes, f), f, p) for f, p in zip(first, prev))

    def _embed(self, ids, lanes, groups):
        """A new token's prelude (its boundary K/V at the lane's position) and initial latent."""
        pos = self.pos[lanes]
        inject = self.model.embed(ids, *self._boundary(pos, self.active[lanes], self.tables[lanes]))
        seeds = torch.tensor([groups[i].params.state_seed for i in lanes], device=pos.device)
        return self.model.initial_state(inject, pos, seeds), inject

    def _boundary(self, pos: torch.Tensor, on: torch.Tensor, tables: torch.Tensor | None = None):
        """-> (positions, attention) of the boundary layers for the lanes (of tables, default all)
        at positions pos. Rows where on write their K/V and read their context; the others, whose
        outputs go unused, sit at position 0 on the scratch block (their attention reads one block)."""
        # (the boundary plane follows the core's)
        backend, P = self.runner.backend, self.pool.num_core_planes
        plane = torch.full_like(pos, P)
        table, slot, pos = backend.lane_rows(
            self.tables if tables is None else tables, plane, P, pos, on, on
        )
        return pos, backend.attention(None, backend.lane_meta(pos, slot, table))

    def _boundary_now(self) -> bool:
        """Fixed depth everywhere: on the passes where lanes reach it; else every wait passes, once
        the host has read that some lane is parked (a boundary pass with none would run the coda,
        head and prelude for nothing)."""
        if self.fixed:
            return self._may_exit()
        self.since += 1
        return self.since >= self.wait and self.seen[1]

    def _read_parked(self) -> None:
        """The newest pass whose flags the host can read without waiting, at the oldest the one
        RUN_AHEAD passes before the newest (waiting for it): lanes neither parked nor ended, lanes
        parked. Between boundary passes the first only falls, the second only grows: older passes
        are dropped. The bound keeps decisions fresh: a host launching faster than the device runs
        would otherwise queue many passes ahead and decide on flags that old (parked lanes waiting,
        and passes with every lane parked, for nothing); one pass queued behind the running one
        keeps the device busy."""
        oldest = len(self.flags) - 1 - RUN_AHEAD
        for i in range(len(self.flags) - 1, -1, -1):
            if i <= oldest or self.flags[i].ready():
                ((running, parked),) = self.flags[i].resolve()
                del self.flags[: i + 1]
                self.seen = (running == 0, parked > 0)
                return

    @torch.inference_mode()
    def step(self) -> DeviceReadback | None:
        """One core pass over every lane, the checks, and on a boundary pass the exits -> (exited,
        tokens, exit depths[, top values, top ids]) on their way to the host; None on other passes."""
        if not self.fixed:
            self._read_parked()
            if self.seen[0]:  # no lane has a loop to run (as the regular path releases parked rows)
                return self._exit()
        run, backend = self.active & ~self.parked, self.runner.backend
        # lanes parked or ended: position 0 (their attention reads one block), outputs dropped
        planes = self.pool.num_core_planes
        table, slot, pos = backend.lane_rows(
            self.tables, self.depth, planes - 1, self.pos, self.active, run
        )
        x, _ = backend.lane_pass(self.x, self.inject, pos, slot, table)
        if self.latent_only:  # one operation (a launch on CUDA) for the bookkeeping and the checks
            # (one may be absent)
            prev = [self.prev.get(c, next(iter(self.prev.values())))[0] for c in LATENT]
            args = (
                self.crit,
                self.min_loops,
                self.max_loops,
                self.threshold,
                *prev,
                self.parked,
                self.active,
            )
            x = x.contiguous()
            counts = backend.latent_checks(x, self.x, run, self.depth, *args)
        else:
            x = torch.where(run.unsqueeze(1), x, self.x)
            depth = self.depth + run
            checked = run & (self.crit > 0) & (depth >= self.min_loops) & (depth < self.max_loops)
            exits = self._check(x, checked)
            self.parked = self.parked | (run & (exits | (depth >= self.max_loops)))
            self.depth = depth
            counts = torch.stack(
                [(~self.parked & self.active).sum(), (self.parked & self.active).sum()]
            )
        self.x = x
        if self._boundary_now():
            return self._exit()
        if not self.fixed:  # (at fixed depth the host knows the exits: it reads no flags)
            self.flags.append(DeviceReadback((counts,)))
        return None

    def _exit(self) -> DeviceReadback:
        """Every parked lane leaves: finalize copies, coda and head, sampling, the next token's prelude."""
        self.since, self.flags, self.seen = 0, [], (False, False)
        done, depth, pos = self.parked & self.active, self.depth, self.pos
        self._finalize(done, depth)
        logits = self.model.head(self.x, *self._boundary(pos, done))
        tokens = self.sampling.sample(logits, keep_raw=bool(self.top_k))
        self.sampling.commit(tokens, done)
        top = top_logprobs(logits, self.top_k, tokens) if self.top_k else ()
        # length: the lane ends
        self.active = self.active & ~(done & (self.out_idx + 1 >= self.max_tokens))
        nxt, npos = done & self.active, pos + done
        inject = self.model.embed(tokens, *self._boundary(npos, nxt))
        state = self.model.initial_state(inject, npos, self.seeds)
        m = nxt.unsqueeze(1)
        self.x, self.inject = torch.where(m, state, self.x), torch.where(m, inject, self.inject)
        self._restart(nxt, state)
        self.depth = torch.where(done | ~self.active, 0, depth)
        self.pos, self.parked = npos, self.parked & ~done
        self.out_idx += done  # in place: the lanes' sampling holds this tensor
        return DeviceReadback((done, tokens, depth) + tuple(top))

    def lane_states(self) -> list[dict]:
        """With each lane's criterion value and whether it is parked (back to the regular path)."""
        states = super().lane_states()
        parked = self.parked.tolist()
        for i, (st, name) in enumerate(zip(states, self.names)):
            prev = self.prev.get(name)
            if prev is None:
                st["criterion_prev"] = None
            elif name in LATENT:  # (the regular path keeps a state: the state's dtype)
                st["criterion_prev"] = prev[0][i : i + 1].to(self.x.dtype)
            else:  # (a stack of one row)
                st["criterion_prev"] = (tuple(v[i : i + 1] for v in prev), 0)
            st["parked"] = 0 if parked[i] and st["active"] else None
        return states


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """mask [L] shaped to select rows of like [L, ...]."""
    return mask.view(-1, *[1] * (like.dim() - 1))
