"""Steady decode: every running request has exactly one decode row in flight and nothing else is
scheduled, so a loop step needs nothing from the host.

Each request is a lane with its state on the device (hidden state, depth, position, survival,
output index, block tables of every plane, sampling and exit parameters). One step runs the core
over every lane at its own depth, decides exits on the device, samples every lane (the host keeps
only the exited ones), does the LAST_EXITED finalize copies under a mask, and advances each lane:
an exited lane starts its next token (embedding of the sampled token, depth 0, next position), the
others go one loop deeper. Exits and tokens come back asynchronously, one step late, like the
regular path's tokens; the host launches step t+1 before it reads step t. A lane whose request ends
is masked off (it then writes only the scratch block). At fixed depth the regular path is faster,
so by default (EngineConfig.steady_decode "adaptive") the engine enters steady decode only while
some request can exit early; with "always" and every lane at fixed depth the host knows which
passes no lane can exit in, and those skip the head, sampling and advance. Families whose
embedding is the loop input (Ouro, Nanbeige) run here; Huginn's lanes add the checks of its
criteria and boundary passes for its prelude and coda (steady_boundary.py).
"""

import numpy as np
import torch

from rlt.kernels.sampler import top_logprobs
from rlt.workers.cuda_graphs import table_width
from rlt.workers.exit_policy import should_exit, update_survival
from rlt.workers.sampling import LaneSampling
from rlt.workers.step_buffers import DeviceReadback


class SteadyDecode:
    @torch.inference_mode()
    def __init__(self, runner, groups):
        """groups: one single-row decode group per lane (some may not be embedded yet)."""
        self.runner, self.model, self.pool = runner, runner.model, runner.pool
        self.params = [g.params for g in groups]
        self.lanes = len(groups)
        dev, pool = runner.device, runner.pool

        def t(values, dtype=torch.int64):
            return torch.tensor(values, dtype=dtype, device=dev)

        # tables padded to the graphs' width bucket once, so no pass pads them again; room for each
        # lane to take at least one more block (set_tables) as it grows
        # (every plane: the core's, then the boundary plane where the family has one)
        W = min(
            table_width(max(len(tab) for g in groups for tab in g.tables.planes) + 1),
            runner.max_table_width,
        )
        tables = np.full((self.lanes, pool.num_planes, W), pool.scratch_block, dtype=np.int64)
        for i, g in enumerate(groups):
            for p, tab in enumerate(g.tables.planes):
                tables[i, p, : len(tab)] = tab
        self.tables = torch.from_numpy(tables).to(dev)
        self.pos, self.depth = t([g.start for g in groups]), t([g.depth for g in groups])
        self.out_idx = t([g.output_index for g in groups])
        self.active = torch.ones(self.lanes, dtype=torch.bool, device=dev)
        self.surv = torch.cat(
            [runner.one if g.survival is None else g.survival for g in groups]
        ).float()
        ps = self.params
        self.min_loops, self.max_loops = t([p.min_loops for p in ps]), t([p.max_loops for p in ps])
        self.threshold = t([p.exit_threshold for p in ps], torch.float32)
        self.max_tokens = t([p.max_tokens for p in ps])
        pen = runner.penalties
        if loads := pen.pending():  # slots of requests admitted just now
            pen.load(runner.buffers.pack(loads))
        self.sampling = LaneSampling(
            groups, self.out_idx, pen, runner.mc.eos_token_ids, runner.backend.ops.random_bits_rows
        )  # (reads out_idx)
        self.top_k = max(p.logprobs for p in ps)
        # Fixed depth everywhere: the host knows on which loops a lane can exit and skips the head,
        # sampling and advance on the others (lanes ended on the device only make it cautious).
        self.fixed = not any(p.exits_early for p in ps)
        self.host_depth, self.alive = [g.depth for g in groups], [True] * self.lanes
        # Lanes not embedded yet: their token is on the host (ids) or still on the device (feed).
        x, inject = [g.state for g in groups], [g.inject for g in groups]
        new = [i for i, g in enumerate(groups) if g.state is None]
        if new:
            ids = t([groups[i].ids[0] for i in new])
            for k, i in enumerate(new):
                if groups[i].feed is not None:
                    tokens, j = groups[i].feed
                    ids[k] = tokens.tokens[j]
            states, injects = self._embed(ids, new, groups)
            for k, i in enumerate(new):
                x[i], inject[i] = states[k : k + 1], injects[k : k + 1]
        self.x, self.inject = torch.cat(x), torch.cat(inject)

    def _embed(
        self, ids: torch.Tensor, lanes: list[int], groups: list
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The loop's first state and its input for the tokens ids [n] of these lanes: both the
        token embedding."""
        emb = self.model.embed(ids, None, None)
        return emb, emb

    def holds(self, positions: int) -> bool:
        """Are the lanes' tables wide enough for this many positions?"""
        return positions <= self.tables.shape[2] * self.pool.block_size

    @torch.inference_mode()
    def set_tables(self, lane: int, tables) -> None:
        """A lane took blocks: its new tables, copied in stream order (the host does not wait)."""
        row = torch.full(self.tables.shape[1:], self.pool.scratch_block, dtype=torch.int64)
        for p, tab in enumerate(tables.planes):
            row[p, : len(tab)] = torch.tensor(tab)
        if self.tables.is_cuda:
            row = row.pin_memory()
        self.tables[lane].copy_(row, non_blocking=True)

    @torch.inference_mode()
    def deactivate(self, lane: int) -> None:
        """Its request ended: the lane keeps its place but writes only the scratch block."""
        self.active[lane] = False
        self.alive[lane] = False

    def _may_exit(self) -> bool:
        if not self.fixed:
            return True
        nxt = [d + 1 for d in self.host_depth]
        self.host_depth = [0 if n >= p.max_loops else n for n, p in zip(nxt, self.params)]
        return any(a and n >= p.max_loops for a, n, p in zip(self.alive, nxt, self.params))

    @torch.inference_mode()
    def step(self) -> DeviceReadback | None:
        """Launch one pass over every lane -> its (exited, tokens, exit depths[, top values, top ids])
        on their way to the host; None when no lane could exit in it (nothing to read)."""
        # (each lane on its depth's plane; ended: scratch)
        backend, on = self.runner.backend, self.active
        table, slot, pos = backend.lane_rows(
            self.tables, self.depth, self.pool.num_core_planes - 1, self.pos, on, on
        )
        x, gate = backend.lane_pass(self.x, self.inject, pos, slot, table)
        depth = self.depth + 1
        if not self._may_exit():
            self.x, self.depth = x, torch.where(self.active, depth, 0)
            return None
        surv = update_survival(self.surv, gate)
        done = (
            should_exit(depth, surv, self.min_loops, self.max_loops, self.threshold) & self.active
        )
        logits = self.model.head(x, None, None)
        tokens = self.sampling.sample(logits, keep_raw=bool(self.top_k))
        self.sampling.commit(tokens, done)
        top = top_logprobs(logits, self.top_k, tokens) if self.top_k else ()
        self._finalize(done, depth)
        emb = self.model.embed(tokens, None, None)
        nxt = done.unsqueeze(1)
        self.x, self.inject = torch.where(nxt, emb, x), torch.where(nxt, emb, self.inject)
        # length: the lane ends
        self.active = self.active & ~(done & (self.out_idx + 1 >= self.max_tokens))
        self.depth = torch.where(done | ~self.active, 0, depth)  # (an ended lane idles at depth 0)
        self.pos = self.pos + done
        self.surv = torch.where(done, 1.0, surv)
        self.out_idx += done  # in place: the lanes' sampling holds this tensor
        return DeviceReadback((done, tokens, depth) + tuple(top))

    def _finalize(self, done: torch.Tensor, depth: torch.Tensor) -> None:
        """LAST_EXITED: lanes done at depth e < D copy their position's K/V of plane e-1 into planes
        e..D-1 (one operation over every lane and plane, the device keeping what it needs)."""
        if self.pool.layout == "last_exited":
            self.runner.backend.finalize(self.tables, self.pos, depth, done)

    def lane_states(self) -> list[dict]:
        """Every lane's state on the host side of the regular path (after the last step is resolved)."""
        depth, pos, out_idx, active = (
            t.tolist() for t in (self.depth, self.pos, self.out_idx, self.active)
        )
        return [
            dict(
                depth=depth[i],
                start=pos[i],
                output_index=out_idx[i],
                active=active[i],
                state=self.x[i : i + 1],
                inject=self.inject[i : i + 1],
                survival=self.surv[i : i + 1],
            )
            for i in range(self.lanes)
        ]
