"""Each family's stage models, run by the dense engine, against the independent reference."""

import pytest
import torch

from rlt.contract.config import EngineConfig
from rlt.contract.sampling_params import SamplingParams
from rlt.contract.validation import resolve_params
from rlt.kernels.random import truncated_normal
from rlt.models.loader import load_model
from rlt.models.model_config import ModelConfig
from rlt.workers.engine import LoopEngine
from tests.models.dense_kv import DenseKV
from tests.models.helpers import Generated, assert_matches
from tests.reference import Ref, ref_generate

PROMPT = [11, 42, 7, 300, 19, 5, 88, 250, 3]


def engine_for(path, overrides=None, dtype=torch.float32):
    mc = ModelConfig.from_pretrained(path, hf_overrides=overrides)
    model = load_model(mc, dtype)
    # no prefix cache: each call computes its prompt (a repeated one compares the numbers run by
    # run)
    return mc, LoopEngine(
        mc, model, EngineConfig(block_size=4, num_blocks=256, enable_prefix_caching=False), dtype
    )


def greedy(mc, engine, prompt, n, **kw):
    p = resolve_params(
        mc,
        len(prompt),
        SamplingParams(
            **({"max_tokens": n, "temperature": 0.0, "ignore_eos": True, "logprobs": 5} | kw)
        ),
    )
    engine.add_request("r", prompt, p)
    outs = []
    while engine.has_work():
        outs += engine.step()
    return Generated(outs)


def huginn_noise(ref, seed=0):
    s = ref.cfg["init_values"]["std"] * ref.cfg["init_values"]["embed_scale"]
    return lambda T: (
        truncated_normal(torch.tensor(seed), torch.arange(T)[:, None], torch.arange(ref.H)[None, :])
        * s
    )


DEPTHS = {
    "ouro": ("total_ut_steps", [1, 2, 3, 4]),
    "nanbeige": ("num_loops", [1, 2, 3]),
    "huginn": ("mean_recurrence", [1, 2, 5, 32]),
}


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_states_every_depth_match_reference(checkpoints, family):
    """After each loop, every prompt position's state equals the reference's."""
    path = checkpoints[family]
    mc, engine = engine_for(path, {"state_init": "zero"} if family == "huginn" else None)
    ref = Ref(path, {"state_init": "zero"} if family == "huginn" else None)
    states, gates = ref.run(PROMPT, [ref.depth] * len(PROMPT))
    model, kv = engine.runner.model, DenseKV(mc)
    pos, ids = torch.arange(len(PROMPT)), torch.tensor(PROMPT)
    inject = model.embed(ids, pos, kv)
    s = model.initial_state(inject, pos, torch.zeros_like(pos))
    for d in range(1, mc.depth + 1):
        kv.plane = d - 1
        s, g = model.loop(s, inject, pos, kv)
        torch.testing.assert_close(s.double(), states[d], atol=1e-4, rtol=1e-4)
        if family == "ouro":
            torch.testing.assert_close(g.double(), gates[d], atol=1e-4, rtol=1e-4)
        else:
            assert g is None
    lg = model.head(s, pos, kv)
    torch.testing.assert_close(lg.double(), ref.logits(states[mc.depth]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_greedy_every_depth_matches_reference(checkpoints, family):
    key, depths = DEPTHS[family]
    for depth in depths:
        ov = {key: depth} | ({"state_init": "zero"} if family == "huginn" else {})
        mc, engine = engine_for(checkpoints[family], ov)
        assert mc.depth == depth
        g = greedy(mc, engine, PROMPT, 6)
        tokens, dd, logps = ref_generate(Ref(checkpoints[family], ov), PROMPT, 6)
        assert_matches(g, tokens, dd, logps)
        assert dd == [depth] * 6


def test_huginn_like_init_matches_reference_with_same_draw(checkpoints):
    mc, engine = engine_for(checkpoints["huginn"], {"mean_recurrence": 4})
    ref = Ref(checkpoints["huginn"], {"mean_recurrence": 4})
    g = greedy(mc, engine, PROMPT, 5, seed=7)
    assert_matches(g, *ref_generate(ref, PROMPT, 5, noise_fn=huginn_noise(ref, seed=7)))
    # The draw is a function of (seed, position): reproducible, and the seed matters.
    assert greedy(mc, engine, PROMPT, 5, seed=7).logprobs == g.logprobs
    assert greedy(mc, engine, PROMPT, 5, seed=8).logprobs != g.logprobs
    # The zero state is a different model input, so different numbers.
    mc0, engine0 = engine_for(checkpoints["huginn"], {"mean_recurrence": 4, "state_init": "zero"})
    assert greedy(mc0, engine0, PROMPT, 5, seed=7).logprobs != g.logprobs


@pytest.mark.parametrize(
    "threshold,min_loops,max_loops", [(0.5, 1, 4), (0.3, 2, 4), (0.6, 1, 3), (0.9, 1, 4)]
)
def test_ouro_adaptive_exit_matches_last_exited_reference(
    checkpoints, threshold, min_loops, max_loops
):
    mc, engine = engine_for(checkpoints["ouro"])
    g = greedy(
        mc, engine, PROMPT, 10, exit_threshold=threshold, min_loops=min_loops, max_loops=max_loops
    )
    tokens, depths, logps = ref_generate(
        Ref(checkpoints["ouro"]), PROMPT, 10, min_loops, max_loops, threshold
    )
    assert_matches(g, tokens, depths, logps)
    assert depths[0] == max_loops  # sampled from the prompt, which runs at max_loops
    assert all(min_loops <= d <= max_loops for d in depths[1:])


def test_ouro_exit_depths_vary_between_tokens(checkpoints):
    mc, engine = engine_for(checkpoints["ouro"])
    g = greedy(mc, engine, PROMPT, 24, exit_threshold=0.5)
    assert len(set(g.exit_depths[1:])) >= 3, g.exit_depths
    # Threshold 1.0 is fixed depth, whatever the gate says.
    assert greedy(mc, engine, PROMPT, 8, exit_threshold=1.0).exit_depths == [4] * 8


@pytest.mark.parametrize("family", ["nanbeige", "huginn"])
def test_max_loops_lowers_decode_depth(checkpoints, family):
    ov = {"state_init": "zero", "mean_recurrence": 6} if family == "huginn" else None
    mc, engine = engine_for(checkpoints[family], ov)
    g = greedy(mc, engine, PROMPT, 6, max_loops=1)
    tokens, depths, logps = ref_generate(Ref(checkpoints[family], ov), PROMPT, 6, max_loops=1)
    assert_matches(g, tokens, depths, logps)
    assert depths == [1] * 6  # the prompt too runs at max_loops


def test_nanbeige_skip_loop_final_norm(checkpoints):
    ov = {"skip_loop_final_norm": True}
    mc, engine = engine_for(checkpoints["nanbeige"], ov)
    g = greedy(mc, engine, PROMPT, 5)
    assert_matches(g, *ref_generate(Ref(checkpoints["nanbeige"], ov), PROMPT, 5))
    assert g.logprobs != greedy(*engine_for(checkpoints["nanbeige"]), PROMPT, 5).logprobs


def test_nanbeige_loops_keep_separate_kv(checkpoints):
    """Negative control: a decode token whose loop 2 reads the prompt's loop-1 K/V (one plane shared
    by both loops) gets different logits; the engine's per-loop planes match the reference."""
    mc, engine = engine_for(checkpoints["nanbeige"])
    model, n = engine.runner.model, len(PROMPT)

    def decode_logits(shared):
        kv = DenseKV(mc)
        pos, ids = torch.arange(n), torch.tensor(PROMPT)
        x = model.embed(ids, pos, kv)
        for d in range(mc.depth):
            kv.plane = d
            x, _ = model.loop(x, x, pos, kv)
        pos, ids = torch.tensor([n]), torch.tensor([PROMPT[0]])
        x = model.embed(ids, pos, kv)
        for d in range(mc.depth):
            kv.plane = 0 if shared else d
            if shared and d > 0:  # drop the new token's loop-1 entry: loop 2 overwrites it
                kv.core_kv[0] = [(K[:-1], V[:-1]) for K, V in kv.core_kv[0]]
            x, _ = model.loop(x, x, pos, kv)
        return model.head(x, pos, kv)[0]

    ref = Ref(checkpoints["nanbeige"])
    states, _ = ref.run(PROMPT + [PROMPT[0]], [2] * (n + 1))
    good = decode_logits(False)
    torch.testing.assert_close(good.double(), ref.logits(states[2])[-1], atol=1e-4, rtol=1e-4)
    assert (decode_logits(True) - good).abs().max() > 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_close_to_float32(checkpoints, dtype):
    mc, e32 = engine_for(checkpoints["ouro"])
    _, e16 = engine_for(checkpoints["ouro"], dtype=dtype)
    a, b = greedy(mc, e32, PROMPT, 1, logprobs=3), greedy(mc, e16, PROMPT, 1, logprobs=3)
    for t, v in a.logprobs[0].items():
        assert abs(b.logprobs[0].get(t, v) - v) < 0.1


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_the_head_weight_is_what_project_multiplies_by(checkpoints, family):
    """rlt.models.weights.head (the roofline's and speculation's byte counts read it) is the weight
    project() multiplies by, whatever the family calls it."""
    from rlt.models.weights import head

    mc = ModelConfig.from_pretrained(checkpoints[family])
    model = load_model(mc, torch.float32)
    seen, ops = [], model.ops

    class Recording:
        def __getattr__(self, name):
            return getattr(ops, name)

        def linear(self, x, w, b=None):
            seen.append(w)
            return ops.linear(x, w, b)

    model.ops = Recording()
    model.project(torch.randn(1, mc.hidden_size))
    assert len(seen) == 1 and head(model) is seen[0]
    assert seen[0].shape == (mc.vocab_size, mc.hidden_size)
