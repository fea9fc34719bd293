"""Penalties over per-request slots of device state (rlt/workers/penalties.py): the torch
reference, and the Triton kernels (rlt/kernels/penalties_triton.py), one launch each; a worker's
backend picks the pair (SlotKernels).

A slot holds `counts` [V] int32 (bit PROMPT: the token is in the prompt; the bits below: its count
among the outputs so far), `tokens` [L] int32 (every token with a nonzero count, each once: the
list the penalties edit) and `length` (how many of `tokens` are listed). Listed tokens are distinct,
so the kernel edits the logits in place, one program per row, with no write racing a read.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch

from rlt.kernels.sampler import Penalties, penalize

PROMPT = 1 << 30  # counts' prompt bit (outputs never reach it: a request has fewer positions)


def penalize_slots(
    x, rows, slots, repetition, frequency, presence, tokens, counts, length, n: int
) -> None:
    """In place on logits x [B, V]: penalize row rows[i] with slot slots[i] (rlt/kernels/sampler.penalize's
    formulas). n >= every listed length (the host's bound; the reference's width)."""
    listed = tokens[:, :n][slots].long()
    own = counts[slots.unsqueeze(1), listed] & (PROMPT - 1)
    penalize(x, Penalties(rows, listed, own, length[slots], repetition, frequency, presence))


def append_slots(sampled, keep, rows, slots, tokens, counts, length) -> None:
    """Row rows[i]'s sampled token is its slot's next output: counted, and listed if it was not.
    keep [B] (bool) or None: only rows with keep set take theirs (a steady lane that did not exit)."""
    tok = sampled[rows]
    add = torch.ones_like(tok, dtype=torch.int32) if keep is None else keep[rows].to(torch.int32)
    old = counts[slots, tok]
    counts[slots, tok] = old + add  # (slots are distinct: no two rows write one entry)
    new = (old == 0) & (add > 0)
    end = length[slots].long()  # (written whatever new is: an entry past the list is ignored)
    tokens[slots, end] = torch.where(new, tok.to(torch.int32), tokens[slots, end])
    length[slots] = length[slots] + new.to(length.dtype)


class SlotKernels(NamedTuple):
    """The two slot operations, with the signatures of penalize_slots and append_slots."""

    penalize: Callable
    append: Callable


REFERENCE = SlotKernels(penalize_slots, append_slots)


def triton_slot_kernels() -> SlotKernels:
    from rlt.kernels import penalties_triton as k

    def penalize(
        x, rows, slots, repetition, frequency, presence, tokens, counts, length, n: int
    ) -> None:
        k.penalize_slots(
            x, rows, slots, repetition, frequency, presence, tokens, counts, length, PROMPT
        )

    return SlotKernels(penalize, k.append_slots)
