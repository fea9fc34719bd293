"""How many KV blocks a worker's pool holds.

num_blocks wins, then kv_memory_bytes. Otherwise, on CUDA, the pool takes what
gpu_memory_utilization leaves of the device once the weights, the largest pass's activations
(measured by running it: max_num_batched_tokens prompt rows with their prompt logprobs, then
max_num_seqs sampled rows with every sampling control and a grammar), the penalty state and memory outside
torch's allocator (the CUDA context, library workspaces) are counted, as vLLM sizes its pool. On
CPU a fixed 1 GiB.
"""

import os

import msgspec
import torch

from rlt.contract.config import CPU_KV_BYTES, EngineConfig
from rlt.contract.sampling_params import SamplingParams, StructuredOutput
from rlt.models.model_config import ModelConfig
from rlt.workers.kv_pool import KVPool

MAX_BLOCKS = 1 << 20  # (host bookkeeping is per block; Huginn's 33 planes fill an H200 with ~70k)
GIB = 2**30
# logit edits and penalties (vLLM's), on: what the profile and the warm-up run through
EDITS = dict(
    repetition_penalty=1.1,
    presence_penalty=0.5,
    frequency_penalty=0.5,
    min_p=0.05,
    logit_bias={1: 1.0},
    min_tokens=1,
)


def grammar(mc) -> dict:
    """A structured output (its bitmask in the sampler) for the profile and the warm-up, where the
    checkpoint has a tokenizer (without one, no request can have a grammar)."""
    if not os.path.exists(os.path.join(mc.path, "tokenizer.json")):
        return {}
    return dict(structured_output=StructuredOutput(regex="[a-z ]{1,40}"))


def finish(engine) -> None:
    """Step until every request has ended (the profile's and the warm-up's). A grammar that does not
    compile fails the start: its request would otherwise wait forever (in service the worker fails
    such a request)."""
    while engine.has_work():
        engine.step()
        if failed := engine.grammars.take_failed():
            raise RuntimeError(f"a structured output did not compile before READY: {failed[0][1]}")


def pool_blocks(
    mc: ModelConfig, model, cfg: EngineConfig, dtype: torch.dtype, device: str, engine_cls, counters
) -> tuple[int, str]:
    """-> (blocks, how they were sized: a line for the worker's log). engine_cls: the LoopEngine
    class, whose largest passes the profile runs (passed in: this module is the engine's), with
    the engine's counters (its passes move the worker's progress)."""
    per_block = mc.kv.block_bytes(cfg.block_size, torch.finfo(dtype).bits // 8)
    if cfg.num_blocks is not None:
        return cfg.num_blocks, "num_blocks"
    if cfg.kv_memory_bytes is not None or not device.startswith("cuda"):
        budget = cfg.kv_memory_bytes or CPU_KV_BYTES
        return max(1, min(MAX_BLOCKS, budget // per_block)), f"kv_memory_bytes {budget}"
    budget, how = _left_for_kv(mc, model, cfg, dtype, device, engine_cls, counters)
    if budget < per_block:
        raise MemoryError(
            f"no KV block fits: {how}; one block is {per_block} bytes (raise gpu_memory_utilization)"
        )
    return min(MAX_BLOCKS, budget // per_block), how


def _left_for_kv(mc, model, cfg: EngineConfig, dtype, device, engine_cls, counters) -> tuple:
    from rlt.contract.validation import MAX_LOGPROBS, resolve_params

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    # The largest passes, on a pool just big enough for them (no graphs: they are captured later,
    # into the headroom gpu_memory_utilization leaves).
    rows, seqs = cfg.max_num_batched_tokens, min(cfg.max_num_seqs, cfg.max_num_batched_tokens)
    probe = msgspec.structs.replace(
        cfg, prefill_chunk=rows, cuda_graph_max_batch=0, steady_decode="never"
    )
    planes = KVPool.planes(mc, cfg.kv_layout)
    blocks = planes * (-(-(rows + 1) // cfg.block_size) + seqs * -(-2 // cfg.block_size))
    sized = msgspec.structs.replace(probe, num_blocks=blocks)
    engine = engine_cls(mc, model, sized, dtype, device, counters)
    # (its prompt logprobs: every row projected, max_num_seqs rows at a time)
    first = SamplingParams(
        max_tokens=1, temperature=0, ignore_eos=True, prompt_logprobs=MAX_LOGPROBS
    )
    # (a model of fewer positions: its longest prompt)
    prompt = [0] * min(rows, mc.max_positions - 1)
    engine.add_request(-1, prompt, resolve_params(mc, len(prompt), first))
    # every sampling control at once: the most temporaries a sampled row makes (penalty state and
    # logit edits and a grammar's bitmask included; the penalty slots were allocated with the
    # engine)
    every = SamplingParams(
        max_tokens=2, temperature=1.0, top_k=5, logprobs=20, **EDITS, **grammar(mc)
    )
    every = resolve_params(mc, 1, every)
    for i in range(seqs):
        engine.add_request(i, [i % mc.vocab_size], every)
    finish(engine)
    torch.cuda.synchronize(device)
    probe_pool = engine.pool.cache.numel() * engine.pool.cache.element_size()
    # the real pool replaces the probe's
    peak = torch.cuda.max_memory_allocated(device) - probe_pool
    del engine
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    # CUDA context, cuBLAS/NCCL workspaces
    outside = total - free - torch.cuda.memory_reserved(device)
    budget = int(cfg.gpu_memory_utilization * total) - peak - outside
    how = (
        f"gpu_memory_utilization {cfg.gpu_memory_utilization} of {total / GIB:.1f} GiB, less weights and "
        f"activations {peak / GIB:.2f} GiB and {outside / GIB:.2f} GiB outside torch: {budget / GIB:.2f} GiB"
    )
    return budget, how
