"""Benchmark measurement (offline decode/prefill, serving, floors, profiles); the CLIs are in scripts/."""
