"""Batched sampler: greedy, temperature, top-k, top-p; noise a pure function of (seed, index)."""

import torch

from rlt.kernels.sampler import SamplingTensors, sample, top_logprobs
from tests.kernels.helpers import reference_logits


def params(B, temperature=1.0, top_k=0, top_p=1.0, seed=0, index=0):
    full = lambda v, dt: torch.full((B,), v, dtype=dt)  # noqa: E731
    return SamplingTensors(
        full(temperature, torch.float32),
        full(top_k, torch.int64),
        full(top_p, torch.float32),
        full(seed, torch.int64),
        full(index, torch.int64),
    )


def test_greedy_is_argmax():
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample(logits, params(8, temperature=0.0)), logits.argmax(-1))


def test_rows_do_not_depend_on_batch_mates():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 300, generator=g)
    p = SamplingTensors(
        torch.tensor([0.0, 0.7, 1.0, 1.3, 1.0, 0.5]),
        torch.tensor([0, 5, 0, 50, 0, 0]),
        torch.tensor([1.0, 1.0, 0.9, 0.8, 1.0, 0.3]),
        torch.tensor([3, 4, 5, 6, 7, 8]),
        torch.tensor([0, 1, 2, 3, 4, 5]),
    )
    batched = sample(logits, p)
    for i in range(6):
        alone = SamplingTensors(
            *(t[i : i + 1] for t in (p.temperature, p.top_k, p.top_p, p.seed, p.output_index))
        )
        assert sample(logits[i : i + 1], alone).item() == batched[i].item()


def test_seed_and_index_determine_the_draw():
    logits = torch.zeros(1, 1000)
    draws = {sample(logits, params(1, seed=s, index=i)).item() for s in range(3) for i in range(3)}
    assert len(draws) >= 8  # uniform over 1000: distinct seeds/indices give distinct tokens
    assert (
        sample(logits, params(1, seed=5, index=2)).item()
        == sample(logits, params(1, seed=5, index=2)).item()
    )


def test_frequencies_follow_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    n = 4000
    toks = sample(
        logits.expand(n, 4),
        SamplingTensors(
            torch.ones(n),
            torch.zeros(n, dtype=torch.int64),
            torch.ones(n),
            torch.arange(n),
            torch.zeros(n, dtype=torch.int64),
        ),
    )
    freq = torch.bincount(toks, minlength=4).float() / n
    assert torch.allclose(freq, logits.softmax(-1)[0], atol=0.03), freq
    # temperature 2 flattens the distribution
    toks = sample(
        logits.expand(n, 4),
        SamplingTensors(
            torch.full((n,), 2.0),
            torch.zeros(n, dtype=torch.int64),
            torch.ones(n),
            torch.arange(n),
            torch.zeros(n, dtype=torch.int64),
        ),
    )
    freq = torch.bincount(toks, minlength=4).float() / n
    assert torch.allclose(freq, (logits / 2).softmax(-1)[0], atol=0.03), freq


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([[3.0, 2.5, 2.0, 1.0, 0.0, -1.0]])
    n = 2000
    expand = lambda **kw: SamplingTensors(
        *(
            torch.full((n,), v)
            for v in (kw.get("t", 1.0), kw.get("k", 0), kw.get("p", 1.0))  # noqa: E731
        ),
        torch.arange(n),
        torch.zeros(n, dtype=torch.int64),
    )
    assert set(sample(logits.expand(n, 6), expand(k=2)).tolist()) == {0, 1}
    # probs ~ [.45,.27,.17,.06,...]: top_p 0.7 keeps {0, 1} (0.45 < 0.7, 0.72 >= 0.7)
    assert set(sample(logits.expand(n, 6), expand(p=0.7)).tolist()) == {0, 1}
    assert set(sample(logits.expand(n, 6), expand(p=0.01)).tolist()) == {0}
    assert set(sample(logits.expand(n, 6), expand(k=1)).tolist()) == {0}


def test_top_logprobs_then_the_sampled_token():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.0, 1.0, 5.0]])
    vals, ids = top_logprobs(logits, 2, torch.tensor([0, 2]))
    assert ids.tolist() == [[1, 2, 0], [2, 1, 2]]
    logp = torch.log_softmax(logits, -1)
    assert torch.allclose(vals, torch.stack([logp[0, [1, 2, 0]], logp[1, [2, 1, 2]]]))


def test_top_p_one_and_top_k_off_drop_nothing():
    """float32 cumsum reaches 1.0 before the end of a large vocabulary: top_p = 1 must still keep
    every token (it is "off"), while top_p < 1 and top-k do cut."""
    from rlt.kernels.sampler import dropped

    scaled = 3 * torch.randn(64, 50000, generator=torch.Generator().manual_seed(0))
    off = dropped(scaled, torch.zeros(64, dtype=torch.int64), torch.ones(64))
    assert not off.any()
    cut = dropped(scaled, torch.full((64,), 10), torch.full((64,), 0.9))
    assert (cut.sum(-1) >= 50000 - 10).all()


def test_unfiltered_shortcut_draws_the_same_tokens():
    """filtered=False (no row uses top-k/top-p: no sort) gives the tokens of the full path, greedy
    rows included; with filtering on the draws differ somewhere."""
    g = torch.Generator().manual_seed(1)
    logits = 2 * torch.randn(40, 3000, generator=g)
    p = params(40, temperature=0.8, seed=7)
    p.temperature[::5] = 0.0
    p.output_index.copy_(torch.arange(40))
    full = sample(logits, p)
    assert torch.equal(sample(logits, p, filtered=False), full)
    assert torch.equal(full[::5], logits[::5].argmax(-1))
    p.top_k.fill_(3)
    assert not torch.equal(sample(logits, p), full)


def test_a_top_p_that_rounds_to_zero_keeps_the_first_token():
    """top_p = 5e-324 passes validation (> 0) but is 0 in float32: the most likely token still stays
    (it once dropped every token and drew token 0)."""
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(2))
    p = params(8, top_p=5e-324)
    p.seed.copy_(torch.arange(8))
    assert torch.equal(sample(logits, p), logits.argmax(-1))


# ---- logit edits and min_p against a plain dense float32 reference, row by row -------------------
V = 300


def rows_case(seed: int, B: int = 10) -> list[dict]:
    """Rows mixing every control (some rows use none): prompts and outputs with repeats."""
    g = torch.Generator().manual_seed(seed)

    def ints(n, hi):
        return torch.randint(0, hi, (n,), generator=g).tolist()

    rows = []
    for i in range(B):
        output = ints(3 * i, 40)  # a small range: tokens repeat, and meet the prompt's
        rows.append(
            dict(
                prompt=ints(1 + i * 2, 60),
                output=output,
                index=len(output),
                rep=[1.0, 1.3, 0.7, 2.0, 1.0][i % 5],
                freq=[0.0, 0.5, -0.4, 1.5, 0.0][i % 5],
                pres=[0.0, 0.5, 0.3, -1.0, 0.0][i % 5],
                bias={t: b for t, b in zip(ints(i % 4, V), [5.0, -3.5, 0.25])},
                min_tokens=[0, 3 * i + 1, 2][i % 3],
                banned=ints(i % 3 + 1, V),  # EOS and stop ids
                temperature=[0.0, 0.7, 1.0, 1.6][i % 4],
                top_k=[0, 0, 20, 5, 0][i % 5],
                top_p=[1.0, 0.9, 1.0, 0.8, 0.95][i % 5],
                min_p=[0.0, 0.05, 0.2, 0.0, 0.5][i % 5],
                seed=100 + i,
            )
        )
    return rows


def reference_draw(x: torch.Tensor, r: dict) -> int:
    """One row: greedy, or temperature, min_p (on probabilities), top-k, top-p, then the Gumbel-max draw."""
    if r["temperature"] == 0:
        return int(x.argmax())
    from rlt.kernels.random import gumbel

    scaled = x / r["temperature"]
    probs = scaled.softmax(-1)
    keep = probs >= r["min_p"] * probs.max()
    order = [int(t) for t in scaled.argsort(descending=True) if keep[t]]
    if r["top_k"] > 0:
        order = order[: r["top_k"]]
    p = scaled[order].softmax(-1)
    mass_before = p.cumsum(-1) - p
    if r["top_p"] < 1.0:
        order = [t for t, m in zip(order, mass_before.tolist()) if m < r["top_p"]] or order[:1]
    noise = gumbel(torch.tensor(r["seed"]), torch.tensor(r["index"]), torch.arange(V))
    return max(order, key=lambda t: float(scaled[t] + noise[t]))


def batched(rows: list[dict], garbage: int = 7):
    """The rows as the sampler's tensors: sparse bias and bans, penalized rows' token lists
    (distinct prompt tokens, then outputs) padded with `garbage` random entries past their length."""
    from rlt.kernels.sampler import LogitEdits, Penalties, penalize

    g = torch.Generator().manual_seed(9)
    bias = [(i, t, b) for i, r in enumerate(rows) for t, b in r["bias"].items()]
    banned = [(i, t, r["min_tokens"]) for i, r in enumerate(rows) for t in r["banned"]]
    pen = [i for i, r in enumerate(rows) if (r["rep"], r["freq"], r["pres"]) != (1.0, 0.0, 0.0)]
    lists = [sorted(set(rows[i]["prompt"])) + rows[i]["output"] for i in pen]
    n = max(map(len, lists)) + garbage
    tokens = torch.randint(0, V, (len(pen), n), generator=g)
    counts = torch.randint(0, 5, (len(pen), n), generator=g, dtype=torch.int32)
    for k, (i, lst) in enumerate(zip(pen, lists)):
        tokens[k, : len(lst)] = torch.tensor(lst)
        counts[k, : len(lst)] = torch.tensor(
            [rows[i]["output"].count(t) for t in lst], dtype=torch.int32
        )
    col = lambda key, dt=torch.float32: torch.tensor([r[key] for r in rows], dtype=dt)  # noqa: E731
    edits = LogitEdits(
        bias=(
            torch.tensor([b[0] for b in bias]),
            torch.tensor([b[1] for b in bias]),
            torch.tensor([b[2] for b in bias]),
        ),
        banned=tuple(torch.tensor(c) for c in zip(*banned)),
    )
    pens = Penalties(
        torch.tensor(pen),
        tokens,
        counts,
        torch.tensor([len(lst) for lst in lists]),
        *(torch.tensor([rows[i][k] for i in pen]) for k in ("rep", "freq", "pres")),
    )
    edits.penalize = lambda x: penalize(x, pens)
    st = SamplingTensors(
        col("temperature"),
        col("top_k", torch.int64),
        col("top_p"),
        col("seed", torch.int64),
        col("index", torch.int64),
        col("min_p"),
    )
    return edits, st


def test_edits_equal_the_dense_reference_row_by_row():
    """logit_bias, min_tokens (a row under it and rows past it), repetition / frequency / presence
    penalties with tokens in the prompt, the outputs or both, and rows using none: the edited
    logits equal the dense reference exactly, and the raw logits stay as they were."""
    from rlt.kernels.sampler import edit

    for seed in range(3):
        rows = rows_case(seed)
        raw = 4 * torch.randn(len(rows), V, generator=torch.Generator().manual_seed(seed))
        edits, st = batched(rows)
        before = raw.clone()
        got = edit(raw, edits, st.output_index)
        assert torch.equal(raw, before)
        for i, r in enumerate(rows):
            assert torch.equal(got[i], reference_logits(raw[i], r)), (seed, i)
        assert torch.equal(edit(raw.clone(), edits, st.output_index, inplace=True), got)
    assert any(r["index"] < r["min_tokens"] for r in rows) and any(
        r["index"] >= r["min_tokens"] > 0 for r in rows
    )


def test_sampled_tokens_equal_the_reference_draw():
    """Greedy rows take the argmax of the edited logits; sampled rows draw, with the same noise, the
    reference's token after temperature, min_p, top-k and top-p."""
    from rlt.kernels.sampler import edit

    for seed in range(4):
        rows = rows_case(seed, B=15)
        raw = 4 * torch.randn(len(rows), V, generator=torch.Generator().manual_seed(seed))
        edits, st = batched(rows)
        got = sample(edit(raw, edits, st.output_index), st)
        want = [reference_draw(reference_logits(raw[i], r), r) for i, r in enumerate(rows)]
        assert got.tolist() == want, seed
        unfiltered = sample(edit(raw, edits, st.output_index), st, filtered=False)
        for i, r in enumerate(rows):  # (no top-k/top-p rows: the unsorted path draws the same)
            if r["top_k"] == 0 and r["top_p"] == 1.0:
                assert unfiltered[i] == got[i]


def test_min_p_keeps_exactly_the_tokens_above_its_share():
    """Over many seeds the draws cover exactly the tokens whose probability (after temperature) is at
    least min_p times the most likely one's."""
    logits = torch.tensor([[3.0, 2.9, 2.0, 1.0, 0.5, -1.0, -3.0]])
    n = 3000
    for temperature, min_p in ((1.0, 0.3), (0.5, 0.3), (2.0, 0.1), (1.0, 1.0)):
        p = params(n, temperature=temperature)
        p.seed.copy_(torch.arange(n))
        p.min_p = torch.full((n,), min_p)
        probs = (logits[0] / temperature).softmax(-1)
        want = {i for i in range(7) if probs[i] >= min_p * probs.max()}
        assert set(sample(logits.expand(n, 7), p, filtered=False).tolist()) == want, (
            temperature,
            min_p,
        )


def test_penalty_formulas_on_a_worked_row():
    """A positive logit is divided by the repetition penalty, a negative one multiplied; frequency
    counts repeats; presence counts once; untouched tokens stay."""
    from rlt.kernels.sampler import LogitEdits, Penalties, edit, penalize

    x = torch.tensor([[2.0, -2.0, 1.0, 0.5, -1.0]])
    pen = Penalties(
        torch.tensor([0]),
        torch.tensor([[0, 1, 2, 2, 2, 4]]),  # prompt {0, 1}; outputs 2, 2, 2; then an ignored entry
        torch.tensor([[0, 0, 3, 3, 3, 9]], dtype=torch.int32),
        torch.tensor([5]),
        torch.tensor([2.0]),
        torch.tensor([0.5]),
        torch.tensor([0.25]),
    )
    got = edit(x, LogitEdits(penalize=lambda x: penalize(x, pen)), torch.tensor([3]))
    assert got.tolist() == [[1.0, -4.0, 1.0 / 2 - 1.5 - 0.25, 0.5, -1.0]]


def test_penalty_slots_follow_the_outputs():
    """The workers' penalty state: slots loaded from a prompt (and a resumed request's outputs),
    then tokens appended on the device pass by pass (some not kept, as a steady lane that did not
    exit): penalizing from the slots equals the dense reference with explicit counts every pass."""
    from types import SimpleNamespace

    from rlt.contract.sampling_params import ResolvedParams
    from rlt.workers.penalties import PenaltyState

    g = torch.Generator().manual_seed(3)
    state = PenaltyState(5, V, 64, "cpu")
    sp = ResolvedParams(
        max_tokens=30, temperature=0.0, top_k=0, top_p=1.0, sampling_seed=0, state_seed=0, min_loops=1, max_loops=1,
        exit_threshold=1.0, stop_token_ids=(), ignore_eos=True, logprobs=0, repetition_penalty=1.5,
        frequency_penalty=0.25, presence_penalty=0.5,
    )  # fmt: skip
    seqs = [
        SimpleNamespace(params=sp, prompt=[4, 9, 4, 30, 2], output=[], slot=None, listed=0),
        # resumed
        SimpleNamespace(params=sp, prompt=[7] * 6, output=[7, 8, 8, 30], slot=None, listed=0),
    ]
    for s in seqs:
        state.take(s)
    state.load({k: torch.from_numpy(v) for k, v in state.pending().items()})
    rows, slots = torch.tensor([0, 1]), torch.tensor([s.slot for s in seqs])
    r, f, p = (torch.full((2,), v) for v in (1.5, 0.25, 0.5))
    for step in range(12):
        raw = 3 * torch.randn(2, V, generator=g)
        x = raw.clone()
        n = max(s.listed + len(s.output) for s in seqs)
        state.penalize(rows, slots, n, r, f, p)(x)
        for i, s in enumerate(seqs):
            ref = dict(
                prompt=s.prompt,
                output=s.output,
                index=0,
                rep=1.5,
                freq=0.25,
                pres=0.5,
                bias={},
                min_tokens=0,
            )
            assert torch.equal(x[i], reference_logits(raw[i], ref)), (step, i)
        sampled = torch.randint(0, 40, (2,), generator=g)
        keep = torch.rand(2, generator=g) < 0.7
        state.append(sampled, keep, rows, slots)
        for s, t, k in zip(seqs, sampled.tolist(), keep.tolist()):
            s.output += [t] * k
    assert state.length[slots].tolist() == [len(set(s.prompt) | set(s.output)) for s in seqs]
