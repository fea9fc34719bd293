"""A model given as a Hugging Face Hub id (`ORG/NAME`), as vLLM takes one: a local directory of that
name wins; otherwise huggingface_hub finds its snapshot, downloading it when online (its own
environment applies: HF_HOME / HF_HUB_CACHE for the cache, HF_TOKEN, HF_HUB_OFFLINE=1 for the
cache alone). Only what rlt reads is fetched: configs, tokenizer files, safetensors."""

import os
import re

from rlt.errors import ConfigError

FILES = ["*.json", "*.safetensors", "*.txt", "*.jinja", "tokenizer*"]


def is_hub_id(model: str) -> bool:
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+", model)) and not model.startswith(".")


def resolve(model: str, revision: str | None = None) -> str:
    """The checkpoint directory for `model`: itself if it exists, else the hub snapshot of an id."""
    if os.path.exists(model) or not is_hub_id(model):
        if revision is not None:
            raise ConfigError(
                f"revision {revision!r} applies to a Hugging Face Hub id, not the path {model!r}"
            )
        return model
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(model, revision=revision, allow_patterns=FILES)
    except Exception as e:  # noqa: BLE001 - not cached offline, unknown, gated, no network: all said the same way
        where = f"{model}@{revision}" if revision else model
        raise ConfigError(
            f"model {where!r} is no local directory, and the Hugging Face Hub gave no snapshot of it "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); download it first "
            f"(`hf download {model}`), set HF_TOKEN for a gated model, or give a checkpoint directory"
        ) from None
