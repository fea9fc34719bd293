"""Kernels used by the workers; each has a plain torch reference, which runs on the CPU, in tests,
and on CUDA with EngineConfig.kernels == "reference" (rlt/kernels/mode.py)."""
