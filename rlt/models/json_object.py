"""A JSON file that must hold an object (a checkpoint's config.json, generation_config.json,
tokenizer files): an error names the file and what is wrong with it. Neutral: the coordinator's
ModelConfig, the workers' tokenizer loading and the server read it without importing each other."""

import json

from rlt.errors import ConfigError


def read_json_object(file: str) -> dict:
    """A checkpoint's JSON file; an error names the file and what is wrong with it."""
    try:
        with open(file, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        raise ConfigError(f"{file} cannot be read as JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{file} is not a JSON object")
    return obj
