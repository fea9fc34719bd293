"""Huginn's exit criteria, per row after each loop, as the authors' `generate_with_adaptive_compute`
evaluates them (recpre/raven_modeling_minimal.py, its *ExitEvaluator classes):

  latent-diff       ||s_t - s_prev|| / ||s_t|| < threshold            (auto 0.03)
  cosine            1 - cos(s_t, s_prev) < threshold                  (auto 1e-3)
  kl                KL(p_prev || p_t) < threshold                     (auto 1e-3)
  minp-kl           the same on min-p (0.1) filtered distributions    (auto 1e-5)
  entropy-diff      |H(p_t) - H(p_prev)| < threshold                  (auto 1e-3)
  argmax-stability  argmax unchanged for >= threshold checks          (auto 5)

s is the loop state, p the next-token distribution of the head over it (logit criteria run the
coda and head for the rows being checked). "prev" is the value at the row's previous check; before
its first, the reference's initial one: the initial latent, uniform log-probs, entropy 100, argmax
-1. A decode row is checked after loops min_loops .. max_loops - 1 (the reference's min_steps is
min_loops - 1) and exits at the first check its criterion holds at, else at max_loops. Prompts run
at max_loops unchecked (the reference's do_not_exit_in_prefill).

The host never waits for a verdict (a pass of Huginn's core is short, and a read-back every pass
would leave the GPU idle while the host builds the next): the next pass carries the checked rows
again, and there a row whose verdict was an exit is held on the device - it keeps its state and
writes its K/V to the scratch block - while the host reads the verdicts and takes the row out,
at the depth it exited at (PendingVerdicts).
"""

import itertools

import numpy as np
import torch
import torch.nn.functional as F

from rlt.contract.sampling_params import EXIT_CRITERIA
from rlt.workers.pass_rows import positions, row_starts
from rlt.workers.step_buffers import DeviceReadback

LATENT = ("latent-diff", "cosine")  # need only the state
MINP = 0.1  # minp-kl: probabilities under this share of the largest are set to 1/V


def initial(criterion: str, state: torch.Tensor) -> torch.Tensor | None:
    """A row's "previous" value before its first check: for the latent criteria its initial latent
    (state [1, H], kept by reference: a pass never writes into the states it is given); None for the
    others, whose initial value is a constant (initial_values)."""
    return state if criterion in LATENT else None


def initial_values(criterion: str, vocab: int, device) -> tuple[torch.Tensor, ...]:
    """The logit criteria's value before a row's first check, one row: uniform log-probs, entropy
    100, argmax -1 seen 0 times."""
    if criterion in ("kl", "minp-kl"):
        return (torch.full((1, vocab), 1.0 / vocab, device=device).log(),)
    if criterion == "entropy-diff":
        return (torch.full((1,), 100.0, device=device),)
    return torch.full((1,), -1, dtype=torch.long, device=device), torch.zeros(
        1, dtype=torch.long, device=device
    )


def _minp_log_probs(logits: torch.Tensor) -> torch.Tensor:
    probs = F.softmax(logits, dim=-1)
    probs = torch.where(
        probs < MINP * probs.max(dim=-1, keepdim=True)[0], 1.0 / logits.shape[-1], probs
    )
    return (probs / probs.sum(dim=-1, keepdim=True)).log()


def evaluate(criterion: str, x: torch.Tensor, prev: tuple, threshold: torch.Tensor):
    """Rows [B] of one criterion: x their states [B, H] (latent) or logits [B, V]; prev their
    previous values, stacked. -> (exit [B] bool, the new previous values)."""
    if criterion == "latent-diff":  # (x is a fresh tensor: the rows' states, concatenated)
        x = x.float()
        return (x - prev[0]).norm(dim=-1) / x.norm(dim=-1) < threshold, (x,)
    if criterion == "cosine":
        x = x.float()
        cos = (x * prev[0]).sum(dim=-1) / x.norm(dim=-1) / prev[0].norm(dim=-1)
        return 1 - cos < threshold, (x,)  # (a zero previous state: NaN, never an exit)
    if criterion in ("kl", "minp-kl"):
        lp = F.log_softmax(x, dim=-1) if criterion == "kl" else _minp_log_probs(x)
        kl = F.kl_div(lp, prev[0], reduction="none", log_target=True).sum(dim=-1)
        return kl < threshold, (lp,)
    if criterion == "entropy-diff":
        p = F.softmax(x, dim=-1)
        h = -torch.sum(p * torch.log(p + 1e-10), dim=-1)
        return (h - prev[0]).abs() < threshold, (h,)
    top = x.argmax(dim=-1)
    stable = torch.where(top == prev[0], prev[1] + 1, torch.zeros_like(prev[1]))
    return stable >= threshold, (top, stable)


def checks_after(g, depth: int) -> bool:
    """Is group g checked by its criterion after loop `depth`?"""
    p = g.params
    return (
        g.decoding
        and g.exit_depth is None
        and g.parked is None
        and p.exit_criterion in EXIT_CRITERIA
        and p.min_loops <= depth < p.max_loops
    )


class CriterionChecks:
    """The checks of one pass: metadata packed with the pass's (one copy), verdicts left on the device
    (PendingVerdicts). Groups are single decode rows, ordered by criterion: each criterion's rows,
    thresholds and logits are contiguous slices. No tensor work per row: a latent criterion's
    previous value is the state a row had at its last check (a reference), a logit criterion's a
    row of the values its last check stacked (Group.criterion_prev: (stack, row)), gathered by one
    index per criterion."""

    def __init__(self, runner, groups: list):
        order = {c: i for i, c in enumerate(EXIT_CRITERIA)}
        self.runner = runner
        self.groups = sorted(groups, key=lambda g: order[g.params.exit_criterion])
        self.logit = [g for g in self.groups if g.params.exit_criterion not in LATENT]
        # logit criterion -> the stacks its rows' previous values are in (None: initial)
        self.sources = {}

    def fields(self) -> dict:
        """Thresholds; for the rows whose criterion reads logits, the coda's boundary-plane metadata
        and where each row's previous value is among its criterion's stacks, concatenated."""
        f = {"chk_thr": np.array([g.params.exit_threshold for g in self.groups], dtype=np.float32)}
        if self.logit:
            rs = row_starts(self.logit)
            f["chk"] = self.runner.backend.plane(
                self.logit, rs, [g.tables.boundary for g in self.logit]
            )
            f["chk_pos"] = positions(self.logit, rs)
        for crit, rows in itertools.groupby(self.logit, key=lambda g: g.params.exit_criterion):
            # id(stack) -> (stack, its first row in the concatenation)
            stacks, index, end = {}, [], 0
            for g in rows:
                stack, i = g.criterion_prev or (None, 0)
                if id(stack) not in stacks:
                    stacks[id(stack)] = (stack, end)
                    end += 1 if stack is None else len(stack[0])
                index.append(stacks[id(stack)][1] + i)
            self.sources[crit] = [stack for stack, _ in stacks.values()]
            f["chk_src_" + crit] = np.array(index)
        return f

    def verdicts(self, t: dict) -> "PendingVerdicts":
        """After the pass: the groups' exits, on their way to the host; each group's previous value
        updated."""
        runner, logits = self.runner, None
        if self.logit:
            attn = runner.backend.attention(None, t["chk"])
            # The coda writes the rows' boundary K/V; the last write, at the exit, is the one kept.
            x = runner.model.after_loop(
                torch.cat([g.state for g in self.logit]), t["chk_pos"], attn
            )
            logits = runner.model.project(x)
        done, row, lrow = [], 0, 0
        for crit, rows in itertools.groupby(self.groups, key=lambda g: g.params.exit_criterion):
            rows = list(rows)
            n = len(rows)
            if crit in LATENT:
                x = torch.cat([g.state for g in rows])
                prev = (torch.cat([g.criterion_prev for g in rows]).float(),)
            else:
                x, lrow = logits[lrow : lrow + n], lrow + n
                init = initial_values(crit, runner.mc.vocab_size, x.device)
                stacks = [init if s is None else s for s in self.sources[crit]]
                prev = tuple(torch.cat(c)[t["chk_src_" + crit]] for c in zip(*stacks))
            exits, new = evaluate(crit, x, prev, t["chk_thr"][row : row + n])
            for i, g in enumerate(rows):
                g.criterion_prev = g.state if crit in LATENT else (new, i)
            done.append(exits)
            row += n
        exits = torch.zeros(len(self.groups) + 1, dtype=torch.bool, device=done[0].device)
        # the last, False, for rows not checked (PendingVerdicts.held)
        torch.cat(done, out=exits[:-1])
        return PendingVerdicts(self.groups, exits)


class PendingVerdicts:
    """One pass's verdicts, read by the host while the next pass runs. That pass holds the rows
    they exit on the device: hold() before it, release() after it."""

    def __init__(self, groups: list, exits: torch.Tensor):
        """exits [len(groups) + 1]: the groups' verdicts, then False."""
        self.groups = groups  # (kept alive: their ids key the index)
        self.index = {id(g): i for i, g in enumerate(groups)}
        self.exits = exits
        self._readback = DeviceReadback((exits[:-1],))

    def held(self, active: list, row_starts: list[int]) -> dict:
        """The next pass's fields: rows of the groups checked here, and their verdicts' indices."""
        rows = [(r, self.index[id(g)]) for g, r in zip(active, row_starts) if id(g) in self.index]
        return (
            {"held_row": np.array([r for r, _ in rows]), "held_src": np.array([i for _, i in rows])}
            if rows
            else {}
        )

    def hold(self, t: dict, active: list, slots: torch.Tensor, scratch_slot: int) -> None:
        """Before that pass (slots: its rows' K/V slots on the device): the rows whose verdict was an
        exit write their K/V to the scratch slot (their position keeps the K/V of the loop they
        exited at)."""
        self.frozen, rows = self.exits[t["held_src"]], t["held_row"]
        slots[rows] = torch.where(self.frozen, scratch_slot, slots[rows])
        self.before = torch.cat([g.state for g in active if id(g) in self.index])

    def release(self, t: dict, x: torch.Tensor) -> None:
        """After it (x: its new states): those rows keep the state they exited with."""
        rows = t["held_row"]
        x[rows] = torch.where(self.frozen[:, None], self.before, x[rows])

    def forget(self, groups: list) -> None:
        """Groups already out of the loop (parked): the next pass neither holds nor exits them again."""
        for g in groups:
            self.index.pop(id(g), None)

    def exited(self) -> set[int]:
        """ids of the groups whose verdict was an exit (waits for the read-back)."""
        (v,) = self._readback.resolve()
        return {id(g) for g, e in zip(self.groups, v) if e and id(g) in self.index}
