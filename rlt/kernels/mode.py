"""Process-wide kernel mode, set once per worker process (EngineConfig.batch_invariant)."""

batch_invariant = False  # CUDA kernels whose per-row results never depend on the batch
