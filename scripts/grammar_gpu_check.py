"""On a GPU (device tool): structured output through LoopEngine with the Triton kernels and CUDA
graphs, after the memory profile (gpu_memory_utilization) and warm_up: constrained outputs valid,
nothing compiled or captured after warm-up, steady decode on or off gives the same tokens.

    python scripts/grammar_gpu_check.py [cpu]   (prints one line per check; exits non-zero on failure)

(On the CPU the torch reference kernels run and there is nothing to warm: a check of the script.)
"""

import json
import sys
import tempfile

import torch

sys.path.insert(0, "tests")
from test_structured_output import check_valid, workload  # noqa: E402

from rlt.config import EngineConfig, ModelConfig  # noqa: E402
from rlt.models.checkpoint import make_checkpoint  # noqa: E402
from rlt.models.loader import load_model  # noqa: E402
from rlt.models.tokenizer import load_tokenizer  # noqa: E402
from rlt.validation import resolve_params  # noqa: E402
from rlt.workers.engine import LoopEngine  # noqa: E402
from rlt.workers.first_use import FirstUse  # noqa: E402
from rlt.workers.warmup import warm_up  # noqa: E402


def main() -> int:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    path = make_checkpoint("ouro", tempfile.mkdtemp() + "/ouro", preset="tiny", seed=1)
    mc = ModelConfig.from_pretrained(path)
    model = load_model(mc, dtype, device)
    tok = load_tokenizer(path)
    reqs = workload(tok)
    results = {}
    for steady in ("never", "always"):
        cfg = EngineConfig(kernels="triton", steady_decode=steady, max_num_seqs=16, gpu_memory_utilization=0.3)
        eng = LoopEngine(mc, model, cfg, dtype, device)
        print(eng.pool_sizing, flush=True)
        print(warm_up(eng, log=lambda s: None), flush=True)
        before = (FirstUse.captures, FirstUse.compiles)
        for rid, (p, sp) in reqs.items():
            eng.add_request(rid, p, resolve_params(mc, len(p), sp))
        out = {r: [] for r in reqs}
        while eng.has_work():
            for o in eng.step():
                out[o.request_id].append((o.token_id, o.exit_depth, o.logprobs, o.finish_reason))
        after = (FirstUse.captures - before[0], FirstUse.compiles - before[1])
        text = {r: tok.decode([o[0] for o in v], skip_special_tokens=True) for r, v in out.items()}
        print(steady, "after warm-up (captures, compiles):", after, json.dumps(text)[:600], flush=True)
        check_valid(tok, out)
        assert after == (0, 0), after
        results[steady] = {r: [o[0] for o in v] for r, v in out.items()}
    same = results["never"] == results["always"]
    print("steady never == always:", same, flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
