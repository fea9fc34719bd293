"""Steady decode for a family with boundary layers (Huginn: prelude -> core x r -> coda), exits by a
latent criterion (exit_criteria.py's latent-diff and cosine) or at fixed depth.

Each pass runs the core over every lane, then checks, on the device, the lanes that just finished a
loop their criterion is checked after; a lane whose check holds (or that reached max_loops) parks:
it keeps its state and writes its K/V to the scratch block until a boundary pass. A boundary pass
takes every parked lane out at once, as the regular path's exit parking does (exit_wait_passes):
LAST_EXITED finalize copies, the coda (writing the position's boundary K/V) and head over every lane,
sampling, then the prelude of each exited lane's new token at the next position (its boundary K/V)
and its initial latent. The coda, head and prelude read their weights whatever the row count, so a
boundary pass costs about one more pass of the core: the host runs one every exit_wait_passes
passes (at fixed depth only on the passes where lanes reach it). Logit criteria, which need the coda
and head after every check, keep the regular path.
"""

import torch

from rlt.kernels.sampler import top_logprobs
from rlt.sampling_params import EXIT_CRITERIA
from rlt.workers.exit_criteria import LATENT
from rlt.workers.exit_policy import exits_early
from rlt.workers.steady import SteadyDecode
from rlt.workers.step_buffers import DeviceReadback


def lane_ready(group) -> bool:
    """Can this decode group be a lane here? Its exit is by a latent criterion, or at fixed depth."""
    p = group.params
    return not exits_early(p) or p.exit_criterion in LATENT


class BoundarySteadyDecode(SteadyDecode):
    @torch.inference_mode()
    def __init__(self, runner, groups, exited: set[int]):
        """exited: ids of the groups whose last regular-path verdict was an exit (they park here)."""
        super().__init__(runner, groups)
        dev = runner.device
        # per lane: 0 no check (fixed depth), 1 latent-diff, 2 cosine
        self.crit = torch.tensor(
            [LATENT.index(p.exit_criterion) + 1 if p.exit_criterion in EXIT_CRITERIA else 0 for p in self.params],
            device=dev,
        )
        # The criterion's previous value: the state at the lane's last check (at first its initial latent)
        prev = [self.x[i : i + 1] if g.criterion_prev is None else g.criterion_prev for i, g in enumerate(groups)]
        self.prev = torch.cat(prev).float()
        self.parked = torch.tensor([g.parked is not None or id(g) in exited for g in groups], device=dev)
        self.seeds = torch.tensor([p.state_seed for p in self.params], device=dev)
        self.wait, self.since = max(1, runner.exit_wait), 0

    def _embed(self, ids, lanes, groups):
        """A new token's prelude (its boundary K/V at the lane's position) and initial latent."""
        pos = self.pos[lanes]
        inject = self.model.embed(ids, pos, self._boundary_attention(pos, self.lane_ids[lanes]))
        seeds = torch.tensor([groups[i].params.state_seed for i in lanes], device=pos.device)
        return self.model.initial_state(inject, pos, seeds), inject

    def _boundary_attention(self, pos: torch.Tensor, lanes: torch.Tensor, write: torch.Tensor | None = None):
        """The boundary layers' attention for these lanes at positions pos; K/V written only where
        write (else to the scratch block); lanes ended read only the scratch block."""
        bs, scratch = self.pool.block_size, self.pool.scratch_block
        table = self.tables[lanes, self.pool.num_core_planes]  # [n, W]
        block = (pos // bs).clamp(max=table.shape[1] - 1).unsqueeze(1)
        slot = table.gather(1, block).squeeze(1) * bs + pos % bs
        on = self.active[lanes] if write is None else write
        slot = torch.where(on, slot, scratch * bs)
        table = torch.where(self.active[lanes].unsqueeze(1), table, scratch)
        return self.runner.backend.attention(None, self.runner.backend.lane_meta(pos, slot, table))

    def _boundary_now(self) -> bool:
        """Fixed depth everywhere: on the passes where lanes reach it; else every wait passes."""
        if self.fixed:
            return self._may_exit()
        self.since += 1
        if self.since < self.wait:
            return False
        self.since = 0
        return True

    @torch.inference_mode()
    def step(self) -> DeviceReadback | None:
        """One core pass over every lane, the checks, and on a boundary pass the exits -> (exited,
        tokens, exit depths[, top values, top ids]) on their way to the host; None on other passes."""
        pool, bs = self.pool, self.pool.block_size
        run = self.active & ~self.parked
        plane = self.depth.clamp(max=pool.num_core_planes - 1) if pool.layout == "last_exited" else 0 * self.depth
        table = self.tables[self.lane_ids, plane]
        block_of = (self.pos // bs).clamp(max=self.tables.shape[2] - 1).unsqueeze(1)
        slot = torch.where(run, table.gather(1, block_of).squeeze(1) * bs + self.pos % bs, self.scratch_slot)
        table = torch.where(self.active.unsqueeze(1), table, pool.scratch_block)
        x, _ = self.runner.backend.lane_pass(self.x, self.inject, self.pos, slot, table)
        x = torch.where(run.unsqueeze(1), x, self.x)
        depth = self.depth + run
        # the checks (exit_criteria.evaluate's latent criteria, row by row)
        checked = run & (self.crit > 0) & (depth >= self.min_loops) & (depth < self.max_loops)
        xf = x.float()
        norm = xf.norm(dim=-1)
        diff = (xf - self.prev).norm(dim=-1) / norm
        cos = (xf * self.prev).sum(dim=-1) / norm / self.prev.norm(dim=-1)
        value = torch.where(self.crit == 1, diff, 1 - cos)
        self.parked = self.parked | (run & ((checked & (value < self.threshold)) | (depth >= self.max_loops)))
        self.prev = torch.where(checked.unsqueeze(1), xf, self.prev)
        self.x, self.depth = x, depth
        return self._exit() if self._boundary_now() else None

    def _exit(self) -> DeviceReadback:
        """Every parked lane leaves: finalize copies, coda and head, sampling, the next token's prelude."""
        pool, bs, D = self.pool, self.pool.block_size, self.depth_max
        done, depth, pos = self.parked & self.active, self.depth, self.pos
        if pool.layout == "last_exited":  # exited at depth e < D: its K/V into planes e..D-1, masked
            block = (pos // bs).clamp(max=self.tables.shape[2] - 1)
            slots = self.tables[:, :D].gather(2, block.view(-1, 1, 1).expand(-1, D, 1)).squeeze(2) * bs
            slots = slots + (pos % bs).unsqueeze(1)  # [L, D]: each core plane's slot of the position
            src = slots.gather(1, (depth - 1).clamp(min=0).unsqueeze(1)).expand(-1, D)
            planes = torch.arange(D, device=pos.device)
            dst = torch.where(done.unsqueeze(1) & (planes >= depth.unsqueeze(1)), slots, self.scratch_slot)
            c = pool.cache
            c[dst // bs, :, :, dst % bs] = c[src // bs, :, :, src % bs]
        logits = self.model.head(self.x, pos, self._boundary_attention(pos, self.lane_ids, done))
        tokens = self.sampling.sample(logits, keep_raw=bool(self.top_k))
        self.sampling.commit(tokens, done)
        top = top_logprobs(logits, self.top_k, tokens) if self.top_k else ()
        self.active = self.active & ~(done & (self.out_idx + 1 >= self.max_tokens))  # length: the lane ends
        nxt, npos = done & self.active, pos + done
        inject = self.model.embed(tokens, npos, self._boundary_attention(npos, self.lane_ids, nxt))
        state = self.model.initial_state(inject, npos, self.seeds)
        m = nxt.unsqueeze(1)
        self.x, self.inject = torch.where(m, state, self.x), torch.where(m, inject, self.inject)
        self.prev = torch.where(m, state.float(), self.prev)
        self.depth = torch.where(done | ~self.active, 0, depth)
        self.pos, self.parked = npos, self.parked & ~done
        self.out_idx += done  # in place: the lanes' sampling holds this tensor
        return DeviceReadback((done, tokens, depth) + tuple(top))

    def lane_states(self) -> list[dict]:
        """With each lane's criterion value and whether it is parked (back to the regular path)."""
        states = super().lane_states()
        parked = self.parked.tolist()
        for i, (st, p) in enumerate(zip(states, self.params)):
            st["criterion_prev"] = self.prev[i : i + 1].to(self.x.dtype) if p.exit_criterion in LATENT else None
            st["parked"] = 0 if parked[i] and st["active"] else None
        return states
