"""Kernels used by the workers; each has a plain torch reference, which runs on the CPU, in tests,
and on CUDA with EngineConfig.kernels == "reference". A worker's backend picks them
(rlt/workers/backend.py; the CUDA graphs that replay them: rlt/workers/cuda_graphs.py).

Modules (a Triton kernel in <name>_triton.py beside its reference where both are long):
  decode_attention.py          paged attention of passes with one query row per segment
  paged_attention.py, _triton  general paged attention (prompt chunks, mixed passes); the plan
  attention_steps.py           device functions the two attention kernels share
  attention.py                 the torch reference attention
  gemv.py                      one-row products; gemv_rows.py: two-row products
  skinny_gemm.py               3 to 32 rows where it beats cuBLAS
  qkv_rope.py                  the one-row q/k/v product with RoPE and the K/V store as its epilogue
  rope.py                      RoPE on q and k and the K/V store, one launch
  norm.py                      RMSNorm, alone and fused with the residual add
  activation.py                SwiGLU from the fused [gate; up] product
  batch_invariant.py           fixed-tiling GEMM: a row's result never depends on its batch
  pdl.py                       programmatic dependent launch for a decode pass's kernels
  sampler.py, random(_triton)  batched sampling; counter-based noise
  penalties.py, _triton        repetition, frequency and presence penalties over device slots
  lane_rows.py, lane_checks.py, kv_copy.py (each with _triton)
                               steady decode's bookkeeping on the device, one launch each
  occupancy.py                 kernels compiled for sm_90a on the CPU: registers and occupancy

Decode attention (decode_attention.py): passes with one query row per segment. One program per
(row, KV head, key slice) serves the whole GQA group; small passes split the keys to fill the GPU,
and a second launch (a program per row and query head, resident early through PDL) merges the
slices: that kernel boundary measured cheaper than the last slice merging behind an arrival
counter. Slices past a row's keys exit before waiting. Passes carrying prompt chunks use the
general paged kernel; a prompt chunk at position 0 of 64+ rows runs as dense causal SDPA (flash)
over its own K/V.

General paged attention (paged_attention_triton.py): a couple of programs per SM take work items
(tile of rows, head, key slice) from a queue, tiles with the most keys first, so a graph sized for
its bucket's most tiles launches nothing for the padding and unequal items balance. Segments
shorter than a tile (decode rows, short chunks) go to a second launch whose items' 64 rows are
(row, head) pairs of a GQA group (KernelPlan.pack): each K/V tile is read once for the group, where
a decode row alone in a 64-row tile read it once per head (3.1x on the attention of 64 decode rows
beside a chunk); longer segments keep tiles of one head, whose 64 rows already share each K/V tile
(packing them measured 7-16 % slower, docs/performance.md). A pass of fewer tiles than fill the GPU
(a prefix hit's new rows over a long cached context) splits each tile's keys into slices
(flash-decoding), as many as keep the items within one wave of programs, merged by the last slice
to finish; batch-invariant mode never splits nor packs. Key tiles wholly before a tile's first row
(every row sees them) skip the causal and bounds masks, and the online softmax runs on exp2 with
the scores scaled into log2 units.

One-row GEMV (gemv.py): one-row products, one config for every shape, SwiGLU fused on the
[gate; up] product. The residual add + RMSNorm after the o and down projections is a launch of its
own (norm.py, in Ouro's last layer with the exit gate's logit), as at every row count: with PDL it
measured cheaper than the product's last program finishing the row. The o and down products read
two weight tiles before their PDL wait (the attention and the SwiGLU product's tail before them
leave HBM idle); the q/k/v product rotates q and k and stores k/v itself (qkv_rope.py, rotate-half
without bias: Ouro, Nanbeige), one launch less a layer. Two-row passes (two requests, or a
speculation round's verify of one draft) take the same design with an accumulator per row
(gemv_rows.py); at 3 and 4 rows it measured slower than cuBLAS (every program reads all of x).

PDL (pdl.py): each decode kernel releases its successor, then waits for its predecessor; before
the wait it reads only what no kernel of the pass writes (weights, positions, slots, older keys).
RLT_PDL=0 turns it off. The compiled-kernel tests check this ordering in the PTX.

RoPE + KV store (rope.py): q and k rotated and k/v stored into their slots in one launch (a one-row
pass of Ouro or Nanbeige: in the q/k/v product, above): a program per token and head for a decode
pass's few rows, past 256 rows a program per two tokens taking every head as dense tiles
(bit-equal; a prompt's at 0.71-0.84 of a copy's pace).

Batch-invariant mode (EngineConfig.batch_invariant): a fixed-tiling Triton GEMM
(batch_invariant.py), the general attention kernel on every pass, no dense path and no GEMV, so a
row's result never depends on its batch and PD equals `single` token for token in bf16. Norms are
one program per row, invariant by construction.

Steady decode's bookkeeping (rlt/workers/steady.py): a pass's device work is a few single launches
rather than dozens of small tensor operations: lane_rows.py (each lane's table, slot and
position), lane_checks.py (the latent criteria's checks and parking, when no lane has a logit
criterion) and kv_copy.py (the finalize copies), each with its torch reference.
"""
