"""Batched sampler: greedy, temperature, top-k, top-p; noise a pure function of (seed, index)."""

import torch

from rlt.kernels.sampler import SamplingTensors, sample, top_logprobs


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
        alone = SamplingTensors(*(t[i : i + 1] for t in (p.temperature, p.top_k, p.top_p, p.seed, p.output_index)))
        assert sample(logits[i : i + 1], alone).item() == batched[i].item()


def test_seed_and_index_determine_the_draw():
    logits = torch.zeros(1, 1000)
    draws = {sample(logits, params(1, seed=s, index=i)).item() for s in range(3) for i in range(3)}
    assert len(draws) >= 8  # uniform over 1000: distinct seeds/indices give distinct tokens
    assert sample(logits, params(1, seed=5, index=2)).item() == sample(logits, params(1, seed=5, index=2)).item()


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
