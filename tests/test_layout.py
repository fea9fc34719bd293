"""The codebase's own rules: one module reads the environment, modules stay small."""

import pathlib
import re

RLT = pathlib.Path(__file__).resolve().parent.parent / "rlt"


def test_only_envs_reads_the_environment():
    readers = [
        str(p.relative_to(RLT))
        for p in RLT.rglob("*.py")
        if p.name != "envs.py" and re.search(r"os\.environ|os\.getenv|getenv\(", p.read_text())
    ]
    assert readers == []


def test_no_module_over_350_lines():
    big = {str(p.relative_to(RLT)): n for p in RLT.rglob("*.py") if (n := len(p.read_text().splitlines())) > 350}
    assert big == {}
