"""Typed, validated reads of a config.json dict for the family config classes (rlt/models/configs.py)."""

from typing import Any

from rlt.errors import ConfigError

_MISSING = object()


class Reader:
    """Typed access to a config dict; every error names the field."""

    def __init__(self, d: dict[str, Any], family: str):
        self.d, self.family = d, family

    def fail(self, name: str, msg: str) -> ConfigError:
        return ConfigError(f"{self.family} config.json field '{name}': {msg}")

    def get(self, name, typ, default=_MISSING):
        if name not in self.d or self.d[name] is None:
            if default is _MISSING:
                raise self.fail(name, "is required")
            return default
        v = self.d[name]
        ok = {
            int: isinstance(v, int) and not isinstance(v, bool),
            float: isinstance(v, (int, float)) and not isinstance(v, bool),
            bool: isinstance(v, bool),
            str: isinstance(v, str),
            list: isinstance(v, list),
            dict: isinstance(v, dict),
        }[typ]
        if not ok:
            raise self.fail(name, f"expected {typ.__name__}, got {v!r}")
        return float(v) if typ is float else v

    def positive(self, name, default=_MISSING) -> int:
        v = self.get(name, int, default)
        if v < 1:
            raise self.fail(name, f"must be >= 1, got {v}")
        return v

    def must_be(self, name, allowed, default=_MISSING):
        v = self.d.get(name, default)
        if v is _MISSING:
            raise self.fail(name, "is required")
        if v not in allowed:
            raise self.fail(
                name, f"{v!r} is not supported (supported: {', '.join(map(repr, allowed))})"
            )
        return v

    def off(self, name, hint=""):
        """A feature flag the engine cannot run: absent, null, false, 0 or empty are fine."""
        v = self.d.get(name)
        if v not in (None, False, 0, 0.0, [], {}, ""):
            raise self.fail(name, f"{v!r} is not supported; remove it or set it off{hint}")

    def rope_theta(self, name="rope_theta", default=_MISSING) -> float:
        """rope_theta; a rope_scaling / rope_parameters dict is accepted only with rope_type 'default'."""
        theta = self.d.get(name)
        for key in ("rope_scaling", "rope_parameters"):
            rs = self.d.get(key)
            if rs is None:
                continue
            if (
                not isinstance(rs, dict)
                or rs.get("rope_type", rs.get("type", "default")) != "default"
            ):
                raise self.fail(
                    key, f"{rs!r} is not supported: only plain RoPE runs (set it to null)"
                )
            theta = rs.get("rope_theta", theta)
        if theta is None:
            if default is _MISSING:
                raise self.fail(name, "is required")
            theta = default
        if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
            raise self.fail(name, f"must be a positive number, got {theta!r}")
        return float(theta)

    def token_ids(self, name) -> tuple[int, ...]:
        v = self.d.get(name)
        if v is None:
            return ()
        vals = v if isinstance(v, list) else [v]
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in vals):
            raise self.fail(name, f"expected a token id or a list of token ids, got {v!r}")
        return tuple(vals)
