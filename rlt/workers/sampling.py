"""Sampling of the rows a pass samples: each row's parameters and logit edits, for the regular path
(built on the host every step, packed with the step's metadata) and for steady decode (fixed per
lane for the stretch; the output index advances on the device).

What no sampled row uses costs nothing: the host knows, and skips its fields and device work.
Penalized rows read and append to their request's slot of PenaltyState (rlt/workers/penalties.py).
"""

import numpy as np
import torch

from rlt.kernels.sampler import LogitEdits, SamplingTensors, edit, sample
from rlt.workers.grammar import mask_fields
from rlt.workers.penalties import PenaltyState


def _banned(p, eos: tuple[int, ...]) -> list[int]:
    """What min_tokens holds back: EOS (unless ignored) and the stop token ids."""
    return list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos))


def _edit_fields(params: list, index: list[int], eos, slots: list) -> dict:
    """Rows' logit_bias entries, min_tokens bans (of rows whose index is under it) and penalties;
    index: each row's output index; slots: each row's (slot, listed) or None."""
    f = {}
    bias = [(i, tok, b) for i, p in enumerate(params) for tok, b in p.logit_bias.items()]
    if bias:
        row, tok, value = zip(*bias)
        f |= {
            "bias_row": np.array(row),
            "bias_tok": np.array(tok),
            "bias_val": np.array(value, dtype=np.float32),
        }
    ban = [
        (i, tok, p.min_tokens)
        for i, (p, k) in enumerate(zip(params, index))
        if k < p.min_tokens
        for tok in _banned(p, eos)
    ]
    if ban:
        row, tok, until = zip(*ban)
        f |= {"ban_row": np.array(row), "ban_tok": np.array(tok), "ban_until": np.array(until)}
    pen = [i for i, s in enumerate(slots) if s is not None]
    if pen:
        f |= {
            "pen_row": np.array(pen),
            "pen_slot": np.array([slots[i][0] for i in pen]),
            "pen_rep": np.array([params[i].repetition_penalty for i in pen], dtype=np.float32),
            "pen_freq": np.array([params[i].frequency_penalty for i in pen], dtype=np.float32),
            "pen_pres": np.array([params[i].presence_penalty for i in pen], dtype=np.float32),
        }
    return f


def _edits(t: dict, state: PenaltyState, n: int) -> LogitEdits | None:
    """The packed edit fields as the sampler's LogitEdits (None: no row has any); n bounds the
    penalized rows' list lengths."""
    if not any(k in t for k in ("bias_row", "ban_row", "pen_row", "gm_row")):
        return None
    pen = (
        (t["pen_row"], t["pen_slot"], n, t["pen_rep"], t["pen_freq"], t["pen_pres"])
        if "pen_row" in t
        else None
    )
    return LogitEdits(
        bias=(t["bias_row"], t["bias_tok"], t["bias_val"]) if "bias_row" in t else None,
        banned=(t["ban_row"], t["ban_tok"], t["ban_until"]) if "ban_row" in t else None,
        penalize=state.penalize(*pen) if pen else None,
        allowed=(t["gm_row"], t["gm_mask"]) if "gm_row" in t else None,
    )


def fields(groups: list, eos: tuple[int, ...]) -> dict:
    """The sampled groups' parameters, as step fields (one row each, in order)."""
    params = [g.params for g in groups]
    index = [g.output_index for g in groups]
    f = {
        "temperature": np.array([p.temperature for p in params], dtype=np.float32),
        "top_k": np.array([p.top_k for p in params]),
        "top_p": np.array([p.top_p for p in params], dtype=np.float32),
        "seed": np.array([p.sampling_seed for p in params]),
        "output_index": np.array(index),
    }
    if any(p.min_p > 0 for p in params):
        f["min_p"] = np.array([p.min_p for p in params], dtype=np.float32)
    slots = [(g.slot, g.listed) if g.slot is not None else None for g in groups]
    return f | _edit_fields(params, index, eos, slots) | mask_fields(groups)


def sample_groups(
    logits: torch.Tensor, t: dict, groups: list, state: PenaltyState, keep_raw: bool, bits_rows
) -> torch.Tensor:
    """logits [B, V] of the sampled groups (t: their packed fields) -> tokens [B]; penalized rows'
    tokens go into their slots. keep_raw: the caller still reads the raw logits (logprobs);
    bits_rows: the worker's random_bits_rows (rlt/models/ops.py)."""
    st = SamplingTensors(
        t["temperature"], t["top_k"], t["top_p"], t["seed"], t["output_index"], t.get("min_p")
    )
    pen = [g for g in groups if g.slot is not None]  # (their lists grow by at most one per output)
    e = _edits(t, state, max((g.listed + g.output_index for g in pen), default=0))
    x = logits if e is None else edit(logits, e, st.output_index, inplace=not keep_raw)
    params = [g.params for g in groups]
    tokens = sample(
        x,
        st,
        greedy=all(p.temperature == 0 for p in params),
        filtered=any(p.top_k > 0 or p.top_p < 1.0 for p in params),
        bits_rows=bits_rows,
    )
    if pen:
        state.append(tokens, None, t["pen_row"], t["pen_slot"])
    return tokens


class LaneSampling:
    """Steady decode: every lane's sampling parameters and edits on the device for the stretch;
    out_idx (each lane's output index, advanced on the device) is shared with the caller."""

    def __init__(
        self,
        groups: list,
        out_idx: torch.Tensor,
        state: PenaltyState,
        eos: tuple[int, ...],
        bits_rows,
    ):
        dev, self.state, self.bits_rows = out_idx.device, state, bits_rows
        ps = [g.params for g in groups]
        index = [g.output_index for g in groups]
        slots = [(g.slot, g.listed) if g.slot is not None else None for g in groups]

        def t(values, dtype=torch.int64):
            return torch.tensor(values, dtype=dtype, device=dev)

        self.sampling = SamplingTensors(
            t([p.temperature for p in ps], torch.float32),
            t([p.top_k for p in ps]),
            t([p.top_p for p in ps], torch.float32),
            t([p.sampling_seed for p in ps]),
            out_idx,
            t([p.min_p for p in ps], torch.float32) if any(p.min_p > 0 for p in ps) else None,
        )
        self.greedy = all(p.temperature == 0 for p in ps)
        self.filtered = any(p.top_k > 0 or p.top_p < 1.0 for p in ps)
        # Bans for as long as a lane is under its min_tokens: until is checked on the device.
        f = _edit_fields(ps, [0] * len(ps), eos, slots)
        f = {k: t(v, torch.float32 if v.dtype.kind == "f" else torch.int64) for k, v in f.items()}
        self.fields, self.pen = f, "pen_row" in f
        if self.pen:  # the lists grow by at most one entry per sampling pass: the host's bound
            pen = [(s[1], k, p.max_tokens) for s, k, p in zip(slots, index, ps) if s is not None]
            self.lanes_start = max(listed + k for listed, k, _ in pen)
            self.lanes_most = max(listed + m for listed, _, m in pen)
            self.passes = 0

    def sample(self, logits: torch.Tensor, keep_raw: bool) -> torch.Tensor:
        """logits [L, V] -> every lane's token [L] (kept only where the lane exits)."""
        n = 0
        if self.pen:
            n = min(self.lanes_start + self.passes, self.lanes_most)
            self.passes += 1
        e = _edits(self.fields, self.state, n)
        x = (
            logits
            if e is None
            else edit(logits, e, self.sampling.output_index, inplace=not keep_raw)
        )
        return sample(
            x, self.sampling, greedy=self.greedy, filtered=self.filtered, bits_rows=self.bits_rows
        )

    def commit(self, tokens: torch.Tensor, done: torch.Tensor) -> None:
        """Penalized lanes that exited count (and list) their token; the others' slots stay as they were."""
        if self.pen:
            self.state.append(tokens, done, self.fields["pen_row"], self.fields["pen_slot"])
