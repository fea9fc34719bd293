"""Benchmark measurement (offline decode/prefill, serving, floors, profiles) and `rlt bench` (cli.py)."""
