"""The engine's options as command-line flags, one per EngineConfig / LaunchConfig field: every
front end that launches an engine from a command line (`rlt generate`, `rlt serve`, `python -m
rlt.dynamo`) offers the same flags and reads them back the same way."""

import argparse

from rlt.contract.config import EngineConfig, LaunchConfig
from rlt.contract.fields import option_fields


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per EngineConfig / LaunchConfig field, its type, choices, help and default taken
    from the field (unset flags are not passed: Engine.launch applies the defaults)."""
    for title, cls in (("engine options", EngineConfig), ("launch options", LaunchConfig)):
        group = parser.add_argument_group(title)
        for name, kind, default, doc in option_fields(cls):
            if name == "faults":  # testing only
                continue
            flag = "--" + name.replace("_", "-")
            text = doc if default is None or "default" in doc else f"{doc} (default: {default})"
            if kind is bool:
                action = argparse.BooleanOptionalAction
                group.add_argument(flag, action=action, default=None, help=text)
            elif isinstance(kind, tuple):
                group.add_argument(flag, choices=kind, default=None, help=text)
            else:
                group.add_argument(flag, type=kind, default=None, help=text)


def option_values(args: argparse.Namespace) -> dict:
    """The EngineConfig / LaunchConfig options given on the command line."""
    fields = (n for cls in (EngineConfig, LaunchConfig) for n, *_ in option_fields(cls))
    names = [n for n in fields if n != "faults"]
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
