"""The engine's options (torch-free: the coordinator reads the defaults without loading torch)."""

from dataclasses import dataclass


@dataclass
class EngineConfig:
    kv_layout: str = "last_exited"
    block_size: int = 16
    num_blocks: int | None = None  # None: sized from kv_memory_bytes
    kv_memory_bytes: int = 1 << 30
    max_num_seqs: int = 64
    prefill_chunk: int = 256  # prompt rows per request per chunk
    max_num_batched_tokens: int = 2048  # rows per core pass
    batch_invariant: bool = False  # CUDA: Triton GEMM/RMSNorm whose per-row result ignores the batch
    cuda_graph_max_batch: int = 256  # CUDA: decode-only core passes up to this many rows replay a graph (0: off)
    steady_decode: bool = True  # decode-only stretches run as device-side lanes (Ouro, Nanbeige)
    # ...also when no running request can exit early: measured 2-6 % slower than the regular path
    # there on an H200 (docs/benchmarks.md), so off unless asked for (tests, benchmarks)
    steady_fixed_depth: bool = False
