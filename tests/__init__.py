"""rlt's tests: tests/<package>/ holds the tests of rlt/<package>/ (docs/architecture.md,
"Testing", gives the rules). Where the suite's heavier checks live:

  control/test_api.py            real worker subprocesses over real ZeroMQ; the caller's loop lag
  workers/test_pd.py             prefill/decode with real NIXL (UCX, DRAM to DRAM)
  workers/test_preemption.py     resumed requests against unpreempted ones (float64: bit for bit)
  workers/test_prefix_cache.py   requests admitted onto cached blocks against the cache-off run
                                 (three families, both layouts, fixed and adaptive depth, greedy
                                 and seeded, single and 1p1d, eviction, Huginn's seed)
  serve/test_serve*.py           `rlt serve` as a subprocess, driven by the official openai client
  dynamo/test_dynamo*.py         etcd, Dynamo's frontend and rlt.dynamo nodes as processes sharing
                                 only the network (KV over UCX's TCP transport), against `single`
                                 through the openai client; test_dynamo_kv.py is marked `alone`
                                 (the KV router's view must catch up between turns)
  kernels/test_kernels_interpreted.py  kernels under Triton's interpreter against their references
  kernels/test_kernels_compiled.py     kernels compiled for sm_90 on the CPU, PDL order in the PTX
  kernels/test_gpu_kernels.py, workers/test_gpu_engine.py  the GPU suite (`-m gpu -p no:xdist`)

Under `-p no:xdist` the suite runs in one process; conftest.py then accepts and ignores the xdist
options in pyproject's addopts.
"""
