"""What the engine tests share: a LoopEngine on a checkpoint and the requests it runs, mixed
sampling parameters, a run through rlt.Engine single or disaggregated, and a spy on preemptions."""

import asyncio

import torch

import rlt
from rlt import SamplingParams
from rlt.contract.config import EngineConfig
from rlt.contract.validation import resolve_params
from rlt.models.loader import load_model
from rlt.models.model_config import ModelConfig
from rlt.workers.engine import LoopEngine
from tests.helpers import FAST_PD, HUGINN, OV, SMALL, all_free

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [3, 4], [100, 200, 300, 400, 500, 6, 7]]


def make(path, family, layout="last_exited", overrides=None, dtype=torch.float32, **cfg):
    ov = overrides if overrides is not None else (HUGINN if family == "huginn" else None)
    mc = ModelConfig.from_pretrained(path, hf_overrides=ov)
    model = load_model(mc, dtype)
    cfg = {"block_size": 4, "num_blocks": 600, "prefill_chunk": 5} | cfg
    return mc, lambda **kw: LoopEngine(
        mc, model, EngineConfig(kv_layout=layout, **(cfg | kw)), dtype
    )


def mixed_params(family):
    gate = family == "ouro"
    return [
        SamplingParams(
            max_tokens=10,
            temperature=0,
            ignore_eos=True,
            exit_threshold=0.5 if gate else None,
            logprobs=3,
        ),
        SamplingParams(max_tokens=7, temperature=1.0, seed=3, ignore_eos=True, logprobs=2),
        SamplingParams(
            max_tokens=9,
            temperature=0.7,
            top_k=20,
            top_p=0.9,
            seed=5,
            ignore_eos=True,
            exit_threshold=0.3 if gate else None,
            min_loops=2 if gate else None,
        ),
    ]


def run(engine, mc, requests, arrivals=None, abort_at=None):
    """requests: {id: (prompt, SamplingParams)}; arrivals: {id: step}. Returns {id: [(tok, depth, lp)]}."""
    arrivals = arrivals or {}
    out, step, added = {r: [] for r in requests}, 0, set()
    # (a step that runs nothing while a grammar compiles off the loop waits on that compile, however
    # long a busy machine takes: only steps that ran a pass count against the cap; a compile that
    # never ends is failed by the pool's own timeout)
    worked = 0
    while len(added) < len(requests) or engine.has_work():
        for rid, (prompt, sp) in requests.items():
            if rid not in added and arrivals.get(rid, 0) <= step:
                engine.add_request(rid, prompt, resolve_params(mc, len(prompt), sp))
                added.add(rid)
        if abort_at and step == abort_at[1]:
            engine.abort(abort_at[0])
        ran = engine.passes + engine.steady_steps
        outputs = engine.step()
        for o in outputs:
            out[o.request_id].append((o.token_id, o.exit_depth, o.logprobs, o.finish_reason))
        step += 1
        worked += bool(outputs) or engine.passes + engine.steady_steps > ran
        assert worked < 2000
    return out


def requests(family):
    gate = family == "ouro"
    prompts = [[5 + i for i in range(17)], [300, 2, 77, 9, 14, 100, 6, 3, 12, 40, 41], [8] * 23]
    params = [
        SamplingParams(max_tokens=9, temperature=0, ignore_eos=True, logprobs=2),
        SamplingParams(max_tokens=7, temperature=1.0, top_k=30, seed=11, ignore_eos=True),
        SamplingParams(
            max_tokens=8,
            temperature=0.8,
            top_p=0.9,
            seed=3,
            ignore_eos=True,
            exit_threshold=0.5 if gate else None,
        ),
    ]
    if gate:
        prompts.append([9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12])
        params.append(
            SamplingParams(
                max_tokens=10, temperature=0, ignore_eos=True, exit_threshold=0.4, min_loops=2
            )
        )
    return list(zip(prompts, params))


async def run_all(path, topology, layout, family, reqs, stats=None, **opts):
    """Every request at once -> (tokens, depths, logprobs, finish) each; stats: a list to append
    the engine's stats after the run to."""
    async with rlt.Engine.launch(
        path,
        topology=topology,
        kv_layout=layout,
        hf_overrides=OV.get(family),
        **(SMALL | FAST_PD | opts),
    ) as engine:

        async def one(i, p, sp):
            async for out in engine.generate(p, sp, request_id=f"q{i}"):
                pass
            return out

        outs = await asyncio.gather(*(one(i, p, sp) for i, (p, sp) in enumerate(reqs)))
        await all_free(engine)
        if stats is not None:
            stats.append(engine.stats())
        return [(o.token_ids, o.exit_depths, o.logprobs, o.finish_reason) for o in outs]


def spy_preemptions(engine) -> list[int]:
    """How many tokens each preempted request had produced when it was preempted."""
    seen, preempt = [], engine.sched.preempt
    engine.sched.preempt = lambda s: (seen.append(len(s.output)), preempt(s))
    return seen
