"""LoopEngine's stretches of steady decode (rlt/workers/steady.py): when one may start and must end,
the blocks its lanes grow into, its lanes read back (as engine.StepOutputs) and handed back to the
regular path."""

from rlt.kernels.sampler import top_dict
from rlt.workers.group import Group
from rlt.workers.sequence import Sequence
from rlt.workers.steady import SteadyDecode
from rlt.workers.steady_boundary import BoundarySteadyDecode


class SteadyStretches:
    """Part of LoopEngine (its state: _steady, _steady_seqs, _live, _pending, running, sched, ...)."""

    def _steady_possible(self) -> bool:
        return (
            self.cfg.steady_decode != "never"
            and self.runner.supports_steady
            and bool(self.running)
            and not self.sched.admissible()
            and all(
                s.group is not None
                and s.group.decoding
                and s.group.n == 1
                and s.group.exit_depth is None
                and s.spec is None
                and not s.prefill_only
                and s.matcher is None
                for s in self.running
            )
            and (
                self.cfg.steady_decode == "always"
                or any(s.group.params.exits_early for s in self.running)
            )
            and self._lanes_fit()
        )

    def _lanes_fit(self) -> bool:
        """Every running request holds the positions its lane may write in the first pass (a stretch
        that ends at once would only rebuild the lanes; a parked lane would never leave)."""
        return all(self.pool.grow(s.tables, self._lane_need(s)) for s in self.running)

    def _lane_need(self, s: Sequence) -> int:
        """Positions a lane may write up to in the next pass: the host knows its position up to the
        pass still unread, a lane moves at most one position per pass, and a boundary family's
        boundary pass also runs the prelude of the next position."""
        return min(s.num_done + 2 + int(self.pool.has_boundary), s.max_positions)

    def _steady_must_end(self) -> bool:
        """A request could be admitted, over a quarter of the lanes ended (they would keep computing
        on the scratch block), or a lane needs a block it cannot have here: back to the regular path
        (which re-enters compacted, or preempts)."""
        dead = sum(self._live.get(s.request_id) is not s for s in self._steady_seqs)
        return (
            self.sched.admissible() or dead > len(self._steady_seqs) // 4 or not self._grow_lanes()
        )

    def _grow_lanes(self) -> bool:
        """Blocks for the positions each live lane may write in the next pass."""
        for lane, s in enumerate(self._steady_seqs):
            need = self._lane_need(s)
            if self._live.get(s.request_id) is not s or self.pool.capacity(s.tables) >= need:
                continue
            if not self._steady.holds(need) or not self.pool.grow(s.tables, need):
                return False
            self._steady.set_tables(lane, s.tables)
        return True

    def _resolve_steady(self, handle, seqs: list[Sequence]) -> list:
        done, tokens, depths, *top = handle.resolve()
        outputs = []
        for lane, s in enumerate(seqs):
            if not done[lane] or self._live.get(s.request_id) is not s:
                continue
            s.num_done += 1
            outputs.append(
                self.append_token(
                    s, tokens[lane], depths[lane], top_dict(top, lane, s.params.logprobs)
                )
            )
            if self._live.get(s.request_id) is not s:  # finished: its lane stops writing
                self._steady.deactivate(lane)
        return outputs

    def _start_steady(self) -> None:
        """The running requests become lanes; a boundary family's groups whose last verdict (one
        pass late on the regular path) was an exit start parked."""
        groups = [s.group for s in self.running]
        if self.pool.has_boundary:
            pending, self.runner.pending = self.runner.pending, None
            self._steady = BoundarySteadyDecode(
                self.runner, groups, pending.exited() if pending else set()
            )
        else:
            self._steady = SteadyDecode(self.runner, groups)
        self._steady_seqs = list(self.running)
        for s in self.running:
            s.group = s.feed = None

    def _end_steady(self) -> list:
        """Back to the regular path: read everything back, give each live lane its group again."""
        outputs = [o for resolve in self._pending for o in resolve()]
        self._pending = []
        for s, st in zip(self._steady_seqs, self._steady.lane_states()):
            if self._live.get(s.request_id) is s:
                s.group = Group(
                    [s.output[-1]],
                    st["start"],
                    s.tables,
                    s.params,
                    True,
                    samples=True,
                    output_index=st["output_index"],
                    depth=st["depth"],
                    inject=st["inject"],
                    state=st["state"],
                    survival=st["survival"],
                    criterion_prev=st.get("criterion_prev"),
                    parked=st.get("parked"),
                    **s.penalty,
                )
        self._steady, self._steady_seqs = None, []
        return outputs
