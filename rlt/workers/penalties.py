"""Device state of the repetition, frequency and presence penalties (vLLM's semantics), which need
each request's prompt and its outputs so far.

A running request that uses them holds a slot from its admission to its end or preemption (layout:
rlt/kernels/penalties.py): per token, whether it is in the prompt and its count among the outputs
([slots, V] int32), and the list of tokens that are either, each once ([slots, L] int32, with its
length). Sampling edits only the listed logits: O(rows x listed tokens) per step, not O(rows x V),
one kernel launch on CUDA, nothing from the host. A sampled token is appended on the device by the
pass that samples it, so steady decode and tokens not read back yet need no host. An admitted (or
resumed, or PD-activated) request's slot is loaded from the tokens the host knows, with the next
pass's metadata (one copy). Allocated at start for max_num_seqs slots (the most requests running
at once), so the memory profile counts it and nothing grows later.
"""

import numpy as np
import torch

from rlt.kernels.penalties import PROMPT, REFERENCE, SlotKernels


class PenaltyState:
    def __init__(
        self, slots: int, vocab: int, positions: int, device, kernels: SlotKernels = REFERENCE
    ):
        self.kernels = kernels  # the worker backend's (rlt/workers/backend.py)
        self.counts = torch.zeros(slots, vocab, dtype=torch.int32, device=device)
        # distinct tokens: at most min(positions, vocab); +1: the reference writes one entry past
        # the list
        self.tokens = torch.zeros(
            slots, min(positions, vocab) + 1, dtype=torch.int32, device=device
        )
        self.length = torch.zeros(slots, dtype=torch.int32, device=device)
        self._free = list(range(slots - 1, -1, -1))
        # slot -> (prompt's distinct tokens, outputs)
        self._loads: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def take(self, s) -> None:
        """A Sequence starts running: a slot if it is penalized, loaded before the next pass from
        its prompt and the outputs the host knows (every one: a resumed request waits for its last).
        s.listed: its prompt's distinct tokens (its list grows by at most one per output)."""
        if not s.params.penalized:
            return
        s.slot = self._free.pop()
        distinct = np.unique(np.asarray(s.prompt, dtype=np.int64))
        s.listed = len(distinct)
        # (replaces a slot given back)
        self._loads[s.slot] = (distinct, np.asarray(s.output, dtype=np.int64))

    def give(self, s) -> None:
        """It stopped running (finished, aborted, preempted, handed off): its slot is free. Work
        already launched on it runs before the next load, in stream order."""
        if s.slot is not None:
            self._free.append(s.slot)
            s.slot = None

    def pending(self) -> dict:
        """The slots taken since the last pass, as step fields for load() (empty: none)."""
        if not self._loads:
            return {}
        slots = np.fromiter(self._loads, np.int64, len(self._loads))
        prompts, outputs = zip(*self._loads.values())
        lists = [np.union1d(p, o) for p, o in zip(prompts, outputs)]
        self._loads = {}
        f = {
            "pl_slot": slots,
            "pl_len": np.array([len(x) for x in lists]),
            "pl_row": np.repeat(slots, [len(x) for x in lists]),
            "pl_pos": np.concatenate([np.arange(len(x)) for x in lists]),
            "pl_tok": np.concatenate(lists),
            "pl_prompt_row": np.repeat(slots, [len(x) for x in prompts]),
            "pl_prompt_tok": np.concatenate(prompts),
        }
        if sum(map(len, outputs)):
            f |= {
                "pl_out_row": np.repeat(slots, [len(x) for x in outputs]),
                "pl_out_tok": np.concatenate(outputs),
            }
        return f

    def load(self, t: dict) -> None:
        """Write the pending slots (t: the packed fields of pending())."""
        if "pl_slot" not in t:
            return
        self.counts.index_fill_(0, t["pl_slot"], 0)
        self.counts[t["pl_prompt_row"], t["pl_prompt_tok"]] = PROMPT
        if "pl_out_row" in t:
            ones = torch.ones_like(t["pl_out_row"], dtype=torch.int32)
            self.counts.index_put_((t["pl_out_row"], t["pl_out_tok"]), ones, accumulate=True)
        self.tokens[t["pl_row"], t["pl_pos"]] = t["pl_tok"].to(torch.int32)
        self.length[t["pl_slot"]] = t["pl_len"].to(torch.int32)

    def penalize(self, rows, slots, n: int, repetition, frequency, presence):
        """In place on logits [B, V]: rows[i] with slot slots[i]; n >= every listed length (the
        host's bound)."""
        state = (self.tokens, self.counts, self.length)
        return lambda x: self.kernels.penalize(
            x, rows, slots, repetition, frequency, presence, *state, n
        )

    def append(self, sampled, keep, rows, slots) -> None:
        """Row rows[i]'s sampled token is slot slots[i]'s next output (keep: only where set)."""
        self.kernels.append(sampled, keep, rows, slots, self.tokens, self.counts, self.length)
