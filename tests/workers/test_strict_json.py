"""Strict JSON shown on outputs (issue 61): with random weights at temperature 1 every byte is likely,
so only the grammar keeps raw control characters, bad escapes, bad UTF-8 and bad numbers out. Outputs
of each kind (free and bounded strings, enums of strings that need escapes, nested objects, arrays,
numbers, forced tool calls): each finished one parses with Python's strict json.loads and validates
against its schema, each tool call goes back into a chat as the next turn's history, and each one cut
at max_tokens (free strings run long) is a prefix of strict JSON. In CI: 1,000 of each kind in one
Ouro engine, 150 of each for every family in one engine and for Ouro through 1p1d workers (the
CPU's reference attention makes 1,000 for all six a quarter of an hour on two cores);
RLT_STRICT_JSON_PER_KIND=1000 runs every family at 1,000 both ways (issue 61's note has that run)."""

import asyncio
import json
import os
import re

import jsonschema
import pytest

import rlt
from rlt import SamplingParams, StructuredOutput
from rlt.contract.validation import resolve_params
from rlt.models.tokenizer import load_tokenizer
from rlt.serve.chat import messages_of
from rlt.serve.structured import _tool_choice
from tests.helpers import FAST_PD, OV
from tests.workers.helpers import make

# 0: 1,000 for Ouro's one engine, else 150
PER_KIND = int(os.environ.get("RLT_STRICT_JSON_PER_KIND", 0))
PD_FAMILIES = ["ouro", "nanbeige", "huginn"] if PER_KIND else ["ouro"]
SHORT = {"type": "string", "maxLength": 3}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "find", "parameters": {"type": "object", "properties": {"q": SHORT}}},
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": -99, "maximum": 999}},
                "required": ["n"],
            },
        },
    },
]


class _Chat:  # (one call: a list of many would run past max_tokens)
    tool_choice, parallel_tool_calls = "required", False


KINDS = {  # kind: (schema, max_tokens)
    "free string": ({"type": "string"}, 12),
    # (5 four-byte characters)
    "bounded string": ({"type": "string", "minLength": 1, "maxLength": 5}, 40),
    "enum": ({"enum": ["a\tb", 'q"', "back\\slash", "\u00fc", "\u0001", "x"]}, 16),
    "nested object": (
        {
            "type": "object",
            "properties": {"o": {"type": "object", "properties": {"k": SHORT}, "required": ["k"]}},
        },
        40,
    ),
    "array": ({"type": "array", "items": SHORT, "maxItems": 3}, 64),
    "number": ({"type": "number", "minimum": -50, "maximum": 50}, 16),
    "tool calls": (_tool_choice(_Chat, TOOLS).json, 64),
}
VALIDATORS = {kind: jsonschema.Draft202012Validator(schema) for kind, (schema, _) in KINDS.items()}
# a strict JSON string's prefix: no raw U+0000-U+001F, only RFC 8259 escapes (the last may be cut)
STRING_PREFIX = re.compile(
    r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*(?:\\(?:u[0-9a-fA-F]{0,3})?)?'
)


def requests(per_kind: int) -> list[tuple[str, list[int], SamplingParams]]:
    out = []
    for kind, (schema, max_tokens) in KINDS.items():
        so = StructuredOutput(json=schema)
        for i in range(per_kind):
            sp = SamplingParams(
                max_tokens=max_tokens, temperature=1.0, seed=i, max_loops=1, structured_output=so
            )
            out.append((kind, [3 + i % 11, 5 + i % 7], sp))
    return out


def check(tok, kind: str, ids: list[int], finish: str) -> bool:
    """-> whether the output finished; asserts it is strict JSON (or, cut, a strict prefix)."""
    text = tok.decode(ids, skip_special_tokens=True)
    assert finish in ("stop", "length"), (kind, finish)
    try:
        value = json.loads(text)
    except ValueError:
        assert finish == "length" and kind == "free string" and STRING_PREFIX.fullmatch(text), (
            kind,
            finish,
            text,
        )
        return False
    VALIDATORS[kind].validate(value)
    if kind == "tool calls":  # as rlt serve returns them, then sent back as the assistant's turn
        calls = [
            {
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["parameters"])},
            }
            for c in value
        ]
        messages_of([{"role": "assistant", "content": None, "tool_calls": calls}])
    return True


def check_all(tok, kinds: list[str], outputs: list[tuple[list[int], str]], per_kind: int) -> None:
    finished = dict.fromkeys(KINDS, 0)
    for kind, (ids, finish) in zip(kinds, outputs, strict=True):
        finished[kind] += check(tok, kind, ids, finish)
    # (complete JSON)
    assert all(n == per_kind for k, n in finished.items() if k != "free string"), finished


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_one_engine(checkpoints, family):
    mc, new_engine = make(
        checkpoints[family], family, num_blocks=4096, block_size=16, max_num_seqs=1024
    )
    engine = new_engine(max_num_batched_tokens=8192)
    per_kind = PER_KIND or (1000 if family == "ouro" else 150)
    reqs = requests(per_kind)
    for r, (_, prompt, sp) in enumerate(reqs):
        engine.add_request(r, prompt, resolve_params(mc, len(prompt), sp))
    outs, finish = [[] for _ in reqs], [None] * len(reqs)
    while engine.has_work():
        for o in engine.step():
            outs[o.request_id].append(o.token_id)
            finish[o.request_id] = o.finish_reason or finish[o.request_id]
    check_all(load_tokenizer(mc.path), [k for k, _, _ in reqs], list(zip(outs, finish)), per_kind)


@pytest.mark.parametrize("family", PD_FAMILIES)
async def test_1p1d(checkpoints, family):
    per_kind = PER_KIND or 150
    reqs = requests(per_kind)
    async with rlt.Engine.launch(
        checkpoints[family],
        topology="1p1d",
        hf_overrides=OV.get(family),
        num_blocks=4096,
        block_size=16,
        max_num_seqs=512,
        max_queued_requests=len(reqs),
        **FAST_PD,
    ) as engine:

        async def one(r, prompt, sp):
            async for out in engine.generate(prompt, sp, request_id=f"s{r}"):
                pass
            return out.token_ids, out.finish_reason

        outs = await asyncio.gather(*(one(r, p, sp) for r, (_, p, sp) in enumerate(reqs)))
    check_all(load_tokenizer(checkpoints[family]), [k for k, _, _ in reqs], outs, per_kind)
