"""Typed option Structs described by their annotations: validate() checks a Struct's values against
its fields' types, Literal choices and msgspec Meta bounds (the error names the field, the limit and
the value); option_fields() gives each field's type, default and help for command-line flags."""

import math
import types
import typing
from typing import Annotated, Literal

import msgspec


def field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in msgspec.structs.fields(cls))


def option_fields(cls) -> list[tuple[str, object, object, str]]:
    """(name, base type, default, help) of each option, for the CLI. The base type is a Literal's
    choices as a tuple, or int / float / bool / str."""
    out = []
    for f in msgspec.structs.fields(cls):
        spec = _spec(f.type)
        out.append((f.name, spec.choices or spec.kind, f.default, spec.doc))
    return out


class _Spec(msgspec.Struct):
    kind: type | None = None  # int, float, bool, str, or a Struct class
    choices: tuple = ()
    optional: bool = False
    ge: float | None = None
    gt: float | None = None
    doc: str = ""


def _spec(annotation) -> _Spec:
    s = _Spec()
    stack = [annotation]
    while stack:
        a = stack.pop()
        origin = typing.get_origin(a)
        if origin is Annotated:
            base, *metas = typing.get_args(a)
            for m in metas:
                s.ge = m.ge if m.ge is not None else s.ge
                s.gt = m.gt if m.gt is not None else s.gt
                s.doc = m.description or s.doc
            stack.append(base)
        elif origin in (typing.Union, types.UnionType):
            stack.extend(typing.get_args(a))
        elif origin is Literal:
            s.choices = typing.get_args(a)
        elif a is type(None):
            s.optional = True
        else:
            s.kind = a
    return s


def validate(obj: msgspec.Struct) -> None:
    """Check every field against its annotation; the error names the field, the limit and the value."""
    for f in msgspec.structs.fields(obj):
        v, s = getattr(obj, f.name), _spec(f.type)
        if v is None and s.optional:
            continue
        if s.choices:
            if v not in s.choices or isinstance(v, bool):
                raise ValueError(
                    f"{f.name} {v!r} is not supported ({', '.join(map(str, s.choices))})"
                )
        elif s.kind is bool:
            if not isinstance(v, bool):
                raise ValueError(f"{f.name} must be True or False, got {v!r}")
        elif s.kind in (int, float):
            ok = (
                isinstance(v, int)
                if s.kind is int
                else isinstance(v, (int, float)) and math.isfinite(v)
            )
            what = "an integer" if s.kind is int else "a number"
            bound = f" >= {s.ge}" if s.ge is not None else f" > {s.gt}" if s.gt is not None else ""
            if (
                not ok
                or isinstance(v, bool)
                or (s.ge is not None and v < s.ge)
                or (s.gt is not None and v <= s.gt)
            ):
                raise ValueError(f"{f.name} must be {what}{bound}, got {v!r}")
        elif isinstance(s.kind, type) and not isinstance(v, s.kind):
            raise ValueError(f"{f.name} must be {s.kind.__name__}, got {v!r}")
