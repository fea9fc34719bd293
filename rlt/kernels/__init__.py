"""Kernels used by the workers; each has a plain torch reference that runs on CPU and in tests."""
