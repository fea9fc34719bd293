"""Kernels used by the workers; each has a plain torch reference, which runs on the CPU, in tests,
and on CUDA with EngineConfig.kernels == "reference". A worker's backend picks them
(rlt/workers/backend.py)."""
