"""Executes one engine step on the device: embed new rows, one core pass over every active row (each
at its own depth, on its own KV plane), exit decisions, LAST_EXITED finalize copies, heads, sampling.

Everything the step needs from the host is packed into one buffer and sent in one copy before the
pass. The host reads the exit mask back only when some row's exit depends on its gate at this
depth; otherwise it knows the exits and runs ahead of the GPU. Exit criteria (Huginn:
rlt/workers/exit_criteria.py, whose logit criteria run the coda and head for the rows they check)
are read one pass late, their exited rows held on the device meanwhile. How the core pass runs (eagerly
or replayed from a CUDA graph) and its attention metadata are the worker's backend's (backend.py).
What exited groups need (finalize copies, sampling parameters, Huginn's coda metadata) is selected
on the host and sent in one more copy. Sampled tokens come back asynchronously (PendingTokens): the
engine launches the next step, whose new decode rows read those tokens on the device, before it
reads them.
"""

import itertools

import numpy as np
import torch

from rlt.contract.config import EngineConfig
from rlt.contract.sampling_params import EXIT_CRITERIA
from rlt.kernels.sampler import top_logprobs
from rlt.models.layers import EmbeddingInput
from rlt.models.model_config import ModelConfig
from rlt.workers.cuda_graphs import table_width
from rlt.workers.exit_criteria import CriterionChecks, checks_after, initial
from rlt.workers.exit_policy import should_exit, update_survival
from rlt.workers.group import Group, PendingTokens, StepResult
from rlt.workers.kv_pool import KVPool
from rlt.workers.pass_rows import kv_slots, positions, row_starts
from rlt.workers.penalties import PenaltyState
from rlt.workers.prompt_logprobs import PromptLogprobs
from rlt.workers.sampling import fields as sampling_fields
from rlt.workers.sampling import sample_groups
from rlt.workers.step_buffers import StepBuffers


class Runner:
    def __init__(
        self, mc: ModelConfig, model, pool: KVPool, backend, device: str, cfg: EngineConfig
    ):
        """backend: the worker's kernel backend (rlt/workers/backend.py): pass metadata, attention,
        CUDA graphs."""
        self.mc, self.model, self.pool, self.backend, self.device = mc, model, pool, backend, device
        self.buffers = StepBuffers(device)
        self.penalties = PenaltyState(
            cfg.max_num_seqs, mc.vocab_size, mc.max_positions, device, backend.slot_kernels
        )
        self.max_rows = cfg.max_num_seqs  # rows projected at once: decode sampling's most
        self.one = torch.ones(1, device=device)  # survival before the first loop (read-only)
        # Steady decode (rlt/workers/steady.py): the loop input is the token embedding, or the
        # family's boundary layers run in its boundary passes (steady_boundary.py)
        self.supports_steady = pool.has_boundary or isinstance(model, EmbeddingInput)
        self.pending = None  # the last pass's criterion verdicts (PendingVerdicts)
        self.exit_wait = cfg.exit_wait_passes

    @property
    def max_table_width(self) -> int:
        """The widest block table a request can have on this worker, padded to its bucket."""
        pool = self.pool
        longest = -(-self.mc.max_positions // pool.block_size)
        return table_width(
            max(1, min(longest, pool.num_blocks // pool.planes(self.mc, pool.layout)))
        )

    @torch.inference_mode()
    def step(self, active: list[Group]) -> StepResult:
        pool = self.pool
        new = [g for g in active if g.state is None]
        boundary = pool.has_boundary
        # row offsets of each group in the pass / among new
        ra, rn = row_starts(active), row_starts(new)
        # (a parked row runs no loop: one handed back by steady decode may sit at the full depth)
        core_tables = [
            g.tables.core[pool.plane_of(min(g.depth + 1, self.mc.depth))] for g in active
        ]
        # Survival and the exit test run on the device only while some row's exit depends on its
        # gate.
        adaptive = any(g.gated for g in active)
        # Rows an exit criterion is checked for after this pass (Huginn: exit_criteria.py).
        checks = [g for g in active if checks_after(g, g.depth + 1)]
        checks = CriterionChecks(self, checks) if checks else None
        pending, self.pending = self.pending, None
        # Rows out of the loop by their criterion, waiting for others (exit_wait_passes): their K/V
        # go
        # to the scratch block and they keep their state, as held rows do.
        parked = [(g, r) for g, r in zip(active, ra) if g.parked is not None]
        if pending is not None and parked:
            pending.forget([g for g, _ in parked])

        # ---- pack the step's metadata: one host-to-device copy -----------------------------------
        f = {"pos": positions(active, ra)}
        # eager, or a graph's replay
        core = self.backend.core_pass(active, ra, f["pos"], core_tables)
        f["core"] = core.inputs
        if adaptive:
            f |= {
                "depth_next": np.array([g.depth + 1 for g in active]),
                "decoding": np.array([g.decoding for g in active]),
                "min_loops": np.array([g.params.min_loops for g in active]),
                "max_loops": np.array([g.params.max_loops for g in active]),
                "threshold": np.array([g.params.exit_threshold for g in active], dtype=np.float32),
                "last_row": np.array(ra[1:]) - 1,
            }
        if checks is not None:
            f |= checks.fields()
        if pending is not None:
            f |= pending.held(active, ra)
        if parked:
            f["park_row"] = np.array([r for _, r in parked])
        fed = next((g.feed[0] for g in new if g.feed is not None), None)
        if new:
            f |= {
                "new_ids": np.fromiter(
                    itertools.chain.from_iterable(g.ids for g in new), np.int64, rn[-1]
                ),
                "new_pos": positions(new, rn),
                "new_seed": np.repeat([g.params.state_seed for g in new], [g.n for g in new]),
            }
            if fed is not None:  # decode rows whose token is still on the device (one row each)
                assert all(g.feed is None or g.feed[0] is fed for g in new), (
                    "fed rows read the last step's tokens"
                )
                f |= {
                    "fed_row": np.array([r for g, r in zip(new, rn) if g.feed is not None]),
                    "fed_src": np.array([g.feed[1] for g in new if g.feed is not None]),
                }
            if boundary:
                f["new_bnd"] = self.backend.plane(new, rn, [g.tables.boundary for g in new])
        f |= self.penalties.pending()  # slots of requests admitted since the last pass
        t = self.buffers.pack(f)
        self.penalties.load(t)

        # ---- embed (Huginn: prelude, boundary KV) and initial state of new rows ------------------
        if new:
            ids = t["new_ids"]
            if "fed_row" in t:  # tokens not read back yet are taken from the device
                ids = ids.index_put((t["fed_row"],), fed.tokens[t["fed_src"]])
            inject = self.model.embed(
                ids, t["new_pos"], self.backend.attention(None, t.get("new_bnd"))
            )
            state = self.model.initial_state(inject, t["new_pos"], t["new_seed"])
            for g, r0, r1 in zip(new, rn, rn[1:]):
                g.inject, g.state = inject[r0:r1], state[r0:r1]
                if g.decoding and g.exit_depth is None and g.params.exit_criterion in EXIT_CRITERIA:
                    g.criterion_prev = initial(g.params.exit_criterion, g.state)

        # ---- one pass of the core over every active row ------------------------------------------
        if held := "held_row" in t:  # rows the last pass's verdicts may exit (exit_criteria.py)
            pending.hold(t, active, core.slots(t["core"]), pool.scratch_block * pool.block_size)
        if parked:
            core.slots(t["core"])[t["park_row"]] = pool.scratch_block * pool.block_size
            kept = torch.cat([g.state for g, _ in parked])
        x, gate = core.run(
            [g.state for g in active], [g.inject for g in active], t["pos"], t["core"]
        )
        if held:
            pending.release(t, x)
        if parked:
            x[t["park_row"]] = kept
        for g, r0, r1 in zip(active, ra, ra[1:]):
            g.state, g.depth = x[r0:r1], g.depth + (g.parked is None)
        if checks is not None:  # (launched before the last pass's verdicts are waited for)
            self.pending = checks.verdicts(t)
        # The last pass's exits by criterion leave now, at the depth they exited at.
        late = pending.exited() if held else set()
        for g in active:
            g.depth -= id(g) in late
        # Prompt chunks and decode tokens alike run to their request's max_loops at most (a prompt
        # at a fixed depth k below the model's is computed at k, as the references compute it).
        done_host = self._leaving(active, late)
        if adaptive:
            surv = torch.cat([self.one if g.survival is None else g.survival for g in active])
            if gate is not None:
                surv = update_survival(surv, gate[t["last_row"]])  # decode groups are single rows
            done = should_exit(
                t["depth_next"], surv, t["min_loops"], t["max_loops"], t["threshold"]
            )
            for g, s in zip(active, surv.split(1)):
                if g.decoding:
                    g.survival = s
            # Read the exit mask back only if some row's exit depends on its gate at this depth;
            # otherwise the host knows it and runs ahead to the next step while the GPU works.
            if any(g.gated and g.params.min_loops <= g.depth < g.params.max_loops for g in active):
                done_host = [
                    d if g.gated else h for g, d, h in zip(active, done.tolist(), done_host)
                ]
        result = StepResult(exited=[g for g, d in zip(active, done_host) if d])
        if result.exited:
            self._exit(result)
        return result

    def _leaving(self, active: list[Group], late: set[int]) -> list[bool]:
        """Which groups leave the pass now. A row its criterion exited (late) parks until the tail
        (coda, head, sampling) runs anyway for another group, or it has waited exit_wait passes, or
        only parked rows are left: then all of them leave together."""
        parks = [g.parked is not None or id(g) in late for g in active]
        leaving = [not p and g.depth >= g.last_depth for g, p in zip(active, parks)]
        if not any(parks):
            return leaving
        waited = max(g.parked or 0 for g, p in zip(active, parks) if p)
        release = any(leaving) or waited >= self.exit_wait or all(parks)
        for g, p in zip(active, parks):
            if p:
                g.parked = None if release else 0 if g.parked is None else g.parked + 1
        return [out or (p and release) for out, p in zip(leaving, parks)]

    def _exit(self, result: StepResult) -> None:
        """Exited groups: LAST_EXITED finalize copies, heads (Huginn: the coda over every row, writing
        boundary KV), batched sampling, prompt logprobs. Selected on the host: one small copy."""
        pool, bs, D = self.pool, self.pool.block_size, self.mc.depth
        exited = result.exited
        sampling = [g for g in exited if g.samples]
        f = {}
        # LAST_EXITED: copy each early-exited decode token's depth-e K/V into planes e+1..D. A
        # prompt
        # run at max_loops k < D needs none: whoever reads its positions (its request, or one
        # sharing
        # its cached blocks, whose keys fix the same prompt depth) runs at most k loops.
        if pool.layout == "last_exited":
            src, dst = [], []
            for g in exited:
                if g.decoding and g.depth < D and g.draft_of is None:  # (a verify writes a draft's)
                    s = kv_slots(g.tables.core[g.depth - 1], g.start, 1, bs)
                    for plane in range(g.depth, D):
                        src += s
                        dst += kv_slots(g.tables.core[plane], g.start, 1, bs)
            if src:
                f |= {
                    "fin_src": np.array(src, dtype=np.int64),
                    "fin_dst": np.array(dst, dtype=np.int64),
                }
        if sampling:
            f |= sampling_fields(sampling, self.mc.eos_token_ids)
        re = row_starts(exited)
        if pool.has_boundary:
            f |= {
                "bnd": self.backend.plane(exited, re, [g.tables.boundary for g in exited]),
                "bnd_pos": positions(exited, re),
                "select": np.array(
                    [r1 - 1 for g, r1 in zip(exited, re[1:]) if g.samples], dtype=np.int64
                ),
            }
        # prompt chunks whose logprobs are asked for
        asking = [g for g in exited if g.prompt_targets]
        if asking:
            f |= PromptLogprobs.fields(exited, re, pool.has_boundary)
        if not f:
            return
        t = self.buffers.pack(f, append=True)
        if "fin_src" in t:
            c, s, d = pool.cache, t["fin_src"], t["fin_dst"]
            c[d // bs, :, :, d % bs] = c[s // bs, :, :, s % bs]
        model, hidden = self.model, None
        if pool.has_boundary:
            attn = self.backend.attention(None, t["bnd"])
            x = model.after_loop(torch.cat([g.state for g in exited]), t["bnd_pos"], attn)
            logits = model.project(x[t["select"]]) if sampling else None
            hidden = x[t["plp_row"]] if asking else None
        else:
            logits = (
                model.head(torch.cat([g.state[-1:] for g in sampling]), None, None)
                if sampling
                else None
            )
            hidden = (
                torch.cat([g.state[: len(g.prompt_targets)] for g in asking]) if asking else None
            )
        if sampling:
            k = max(g.params.logprobs for g in sampling)
            tokens = sample_groups(
                logits, t, sampling, self.penalties, k > 0, self.backend.ops.random_bits_rows
            )
            result.sampled = PendingTokens(
                sampling, tokens, top_logprobs(logits, k, tokens) if k else None
            )
            del logits  # (before the prompt logprobs' own)
        if asking:
            result.prompt_logprobs = PromptLogprobs(
                model.project, hidden, t["plp_target"], asking, self.max_rows
            )
