"""How often a second chat turn finds its prefix through Dynamo's frontend: two aggregated rlt nodes
(the tiny Ouro on CPU by default), one frontend with --router-mode kv and one round robin, 16
two-turn conversations through each. A hit: the second turn reports the first turn's full blocks
as cached_tokens. Needs etcd and the dynamo extra (as tests/test_dynamo_kv.py).

    python scripts/dynamo_kv_routing.py [--model DIR] [--conversations 16]
"""

import argparse
import asyncio
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_dynamo import _get, _start, _stop, _wait  # noqa: E402
from test_dynamo_kv import TURN, KvStack, _client, _turn  # noqa: E402
from test_serve import free_port  # noqa: E402


async def hit_rate(client, model: str, n: int, seed: int) -> float:
    rng, hits = random.Random(seed), 0
    for _ in range(n):
        prompt = [rng.randrange(5, 300) for _ in range(TURN)]
        reply, _ = await _turn(client, prompt, model=model)
        _, cached = await _turn(client, prompt + reply + [7, 8, 9, 10], model=model)
        hits += cached > 0
    return hits / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="checkpoint directory (default: a tiny random Ouro)")
    p.add_argument("--conversations", type=int, default=16)
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="rlt-kv-routing-")
    model = args.model
    if model is None:
        from rlt.models.checkpoint import make_checkpoint

        model = make_checkpoint("ouro", os.path.join(tmp, "ouro"), preset="tiny", seed=1)
    s = KvStack(tmp, model)
    rr = None
    try:
        for name in ("a", "b"):
            s.node(name)
        for name in ("a", "b"):
            s.wait_ready(name)
        rr_port = str(free_port())
        rr = _start([sys.executable, "-m", "dynamo.frontend", "--http-port", rr_port], s.log("rr"), s.env)
        rr_url = f"http://127.0.0.1:{rr_port}/v1"
        for url, proc in ((s.url, s.frontend), (rr_url, rr)):
            _wait(lambda u=url: '"kv"' in (_get(f"{u}/models") or ""), "the model", proc, s.log("rr"))
        kv_rate = asyncio.run(hit_rate(_client(s), "kv", args.conversations, 0))
        s.url = rr_url
        rr_rate = asyncio.run(hit_rate(_client(s), "kv", args.conversations, 1))
        print(f"second turns that hit their prefix, {args.conversations} conversations over two nodes:")
        print(f"  Dynamo KV router: {kv_rate:.0%}   round robin: {rr_rate:.0%}")
    finally:
        if rr is not None:
            _stop(rr)
        s.close()


if __name__ == "__main__":
    main()
