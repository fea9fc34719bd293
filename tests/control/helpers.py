"""What the rlt.Engine tests share: a process's liveness, one request's outputs collected, the same
requests through a LoopEngine in this process, and a mixed workload."""

import os
import random

import torch

from rlt import SamplingParams
from rlt.contract.config import EngineConfig
from rlt.contract.validation import resolve_params
from rlt.models.loader import load_model
from rlt.models.model_config import ModelConfig
from rlt.workers.engine import LoopEngine


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split()[2] != "Z"


async def collect(engine, prompt, sp, rid=None):
    outs = [o async for o in engine.generate(prompt, sp, request_id=rid)]
    assert outs and outs[-1].finished and all(not o.finished for o in outs[:-1])
    return outs[-1]


def direct(path, requests):
    """The same worker engine in-process: {rid: (tokens, depths)}."""
    mc = ModelConfig.from_pretrained(path)
    eng = LoopEngine(mc, load_model(mc, torch.float32), EngineConfig(), torch.float32)
    for rid, (prompt, sp) in requests.items():
        eng.add_request(rid, prompt, resolve_params(mc, len(prompt), sp))
    out = {rid: ([], []) for rid in requests}
    while eng.has_work():
        for o in eng.step():
            out[o.request_id][0].append(o.token_id)
            out[o.request_id][1].append(o.exit_depth)
    return out


def workload(n):
    rng = random.Random(0)
    reqs = {}
    for i in range(n):
        prompt = [rng.randrange(3, 500) for _ in range(rng.randrange(2, 20))]
        sp = SamplingParams(
            max_tokens=rng.randrange(4, 14),
            temperature=rng.choice([0.0, 0.8]),
            seed=i,
            exit_threshold=rng.choice([None, 0.5, 0.3]),
            ignore_eos=True,
        )
        reqs[f"r{i}"] = (prompt, sp)
    return reqs
