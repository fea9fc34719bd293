"""Structured-output cases: a grammar of each kind for a tokenizer, and the check that an output
obeys its grammar."""

import json
import re

import jsonschema
import msgspec

from rlt import SamplingParams, StructuredOutput

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["x", "yz"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
        "kind": {"enum": ["a", "b"]},
        "score": {"type": "number", "minimum": 0, "maximum": 10},
    },
    "required": ["name", "age", "tags", "ok", "kind", "score"],
    "additionalProperties": False,
}


REGEX = r"[a-c]{2,4}-[0-9]{3}( ok)?"


CHOICES = ["yes", "no", "maybe so"]


GRAMMAR = 'root ::= "x" ("y" | "zz") [0-9] [0-9]? "!"'


def workload(tok) -> dict:
    """Constrained (seeded and greedy) and unconstrained requests together."""
    so = StructuredOutput
    close, obj = tok.convert_tokens_to_ids("}"), so(json_object=True)
    seeded = [
        SamplingParams(max_tokens=120, temperature=1.0, seed=s, structured_output=so(json=SCHEMA))
        for s in (1, 2)
    ]
    return {
        "j1": ([5, 6, 7, 8, 9, 10, 11], seeded[0]),
        "j2": ([3, 4], seeded[1]),
        "r": (
            [3, 9, 27],
            SamplingParams(
                max_tokens=40, temperature=0.9, seed=4, structured_output=so(regex=REGEX)
            ),
        ),
        "c": (
            [8] * 9,
            SamplingParams(
                max_tokens=20, temperature=1.0, seed=5, structured_output=so(choice=CHOICES)
            ),
        ),
        # (the bias would take "}" first; the grammar makes it wait for "{")
        "o": (
            [4, 4],
            SamplingParams(
                max_tokens=9, temperature=0, logit_bias={close: 100.0}, structured_output=obj
            ),
        ),
        "g": (
            [4, 5],
            SamplingParams(max_tokens=20, temperature=0, structured_output=so(grammar=GRAMMAR)),
        ),
        "free": (
            [5, 6, 7],
            SamplingParams(max_tokens=12, temperature=1.0, seed=6, ignore_eos=True),
        ),
        # Ouro: most tokens exit in their first loop, before the token before them is read back
        "e": ([7, 7, 7], msgspec.structs.replace(seeded[0], seed=9, exit_threshold=0.05)),
    }


def check_valid(tok, got: dict) -> None:
    """Every constrained output is complete (finish "stop") and obeys its grammar."""
    text = {r: tok.decode([o[0] for o in v], skip_special_tokens=True) for r, v in got.items()}
    for r in ("j1", "j2", "e", "r", "c", "o", "g"):
        assert got[r][-1][3] == "stop", (r, text[r])
    for r in ("j1", "j2", "e"):
        jsonschema.validate(json.loads(text[r]), SCHEMA)
    assert re.fullmatch(REGEX, text["r"]), text["r"]
    assert text["c"] in CHOICES
    assert json.loads(text["o"]) == {}
    assert re.fullmatch(r"x(y|zz)[0-9][0-9]?!", text["g"]), text["g"]
