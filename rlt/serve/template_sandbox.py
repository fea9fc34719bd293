"""Chat templates rendered under bounds: transformers renders them in Jinja's immutable sandbox, which
stops attribute tricks but not work: `{{ 'a' * 300000000 }}` or two nested `range(100000)` loops hold a
thread for seconds to hours and allocate without limit. rlt compiles each template once more in
transformers' own environment (its filters, globals and extensions), with the sandbox's hooks set:
`*`, `**` and `+` may not build a string or list past the output bound nor a number past 10^1000,
`range` yields under the deadline, and the output is gathered piece by piece, each piece checked
against the size bound and the deadline. Past either, a TemplateBoundError (the request's 400).

`install()` points transformers' template compiler here (once, in the server); `bounds()` sets the
limits of the rendering in this thread.
"""

import contextlib
import contextvars
import functools
import operator
import time

MAX_POWER_DIGITS = 1000

_limits: contextvars.ContextVar[tuple[int, float] | None] = contextvars.ContextVar(
    "rlt_template_limits", default=None
)


class TemplateBoundError(Exception):
    """A template's rendering went past the output size or time bound."""


@contextlib.contextmanager
def bounds(max_chars: int, seconds: float):
    """Renderings in this context write at most max_chars characters within `seconds`."""
    token = _limits.set((max_chars, time.monotonic() + seconds))
    try:
        yield
    finally:
        _limits.reset(token)


def _check(size: int = 0) -> None:
    if (limits := _limits.get()) is None:
        return
    max_chars, deadline = limits
    if size > max_chars:
        raise TemplateBoundError(f"the chat template's output would pass {max_chars} characters")
    if time.monotonic() > deadline:
        raise TemplateBoundError("the chat template took longer than its time limit to render")


def _size(v) -> int:
    return len(v) if isinstance(v, (str, list, tuple)) else 0


def _binop(context, op: str, left, right):
    """`*`, `**` and `+` under the bounds."""
    if op == "*" and isinstance(left, int) != isinstance(right, int):
        n, seq = (left, right) if isinstance(left, int) else (right, left)
        _check(_size(seq) * max(0, n))
    elif op == "+":
        _check(_size(left) + _size(right))
    elif op == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        if right * len(str(abs(left) or 1)) > MAX_POWER_DIGITS:
            raise TemplateBoundError(f"the chat template's number {left} ** {right} is too large")
    return {"*": operator.mul, "**": operator.pow, "+": operator.add}[op](left, right)


def _range(*args):
    for i, v in enumerate(range(*args)):
        if i % 1024 == 0:
            _check()
        yield v


class _BoundedTemplate:
    """Mixed into the environment's template class: render gathers generate()'s pieces under the bounds."""

    def render(self, *args, **kwargs) -> str:
        pieces, size = [], 0
        for piece in self.generate(*args, **kwargs):
            size += len(piece)
            _check(size)
            pieces.append(piece)
        return "".join(pieces)


@functools.cache
def _environment():
    """transformers' template environment (taken from an empty template's: the client's is never
    compiled without the hooks, which also stop Jinja folding `'a' * 300000000` at compile time)."""
    from transformers.utils import chat_template_utils as ctu

    env = ctu._cached_compile_jinja_template("").environment
    env.intercepted_binops = frozenset(("*", "**", "+"))
    env.call_binop = _binop
    env.globals["range"] = _range
    return env, type("BoundedTemplate", (_BoundedTemplate, env.template_class), {})


@functools.lru_cache(maxsize=64)
def compile_bounded(chat_template: str):
    env, cls = _environment()
    return env.from_string(chat_template, template_class=cls)


def install() -> None:
    from transformers.utils import chat_template_utils as ctu

    ctu._compile_jinja_template = compile_bounded
