"""The authors' reference outputs of Huginn's adaptive compute (dev/huginn_reference.py) and how
a case becomes rlt's request options: tests/workers/huginn_reference.json (tests/conftest.py's tiny
Huginn, seed 1) and the held-out tests/workers/huginn_reference_heldout.json."""

import json
import os

from rlt.contract.sampling_params import EXIT_CRITERIA, SamplingParams


def _load(name: str) -> dict:
    with open(os.path.join(os.path.dirname(__file__), name)) as f:
        return json.load(f)


FIXTURE = _load("huginn_reference.json")
HELDOUT = _load("huginn_reference_heldout.json")
# The fixture's checkpoint is tests/conftest.py's `checkpoints["huginn"]` (tiny, seed 1).
assert FIXTURE["checkpoint"] == {"family": "huginn", "preset": "tiny", "seed": 1}
N = FIXTURE["max_new_tokens"]
FIXED = [c for c in FIXTURE["cases"] if c["criterion"] == "none"]
CASES = [c for c in FIXTURE["cases"] if c["criterion"] != "none"]
assert {c["criterion"] for c in CASES} == set(EXIT_CRITERIA)
# Thresholds under which exits vary (the "auto" ones never exit on these random weights)
VARIED = [c for c in CASES if c["threshold"] != "auto"]
assert all(len(set(c["depths"][1:])) >= 2 for c in VARIED)


def params(c: dict, n: int = N) -> SamplingParams:
    """The fixture case's options: the reference's min_steps = m is min_loops = m + 1; fixed depth
    num_steps = k is min_loops = max_loops = k."""
    if c["criterion"] == "none":
        return SamplingParams(
            max_tokens=n,
            temperature=0,
            ignore_eos=True,
            min_loops=c["num_steps"],
            max_loops=c["num_steps"],
        )
    return SamplingParams(
        max_tokens=n,
        temperature=0,
        ignore_eos=True,
        exit_criterion=c["criterion"],
        exit_threshold=None if c["threshold"] == "auto" else c["threshold"],
        min_loops=c["min_steps"] + 1,
    )


def expect(out: dict, cases: list) -> None:
    for i, c in enumerate(cases):
        got = ([o[0] for o in out[i]], [o[1] for o in out[i]])
        assert got == (c["tokens"], c["depths"]), (
            c["criterion"],
            c["threshold"],
            c.get("min_steps"),
        )
