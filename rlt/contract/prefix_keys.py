"""Prefix-cache keys: a hash chain over each full block's (tokens, depths), rooted in the state
seed where the family draws its initial latent from it (rlt/workers/prefix_cache.py says why).
Family- and process-neutral: the worker's cache keys its blocks with it, the coordinator its
routing and the KV events it reports (rlt/control), so neither side imports the other's package.
"""

import hashlib

import numpy as np


def root_key(random_initial_state: bool, state_seed: int) -> bytes:
    """The chain's root: the state seed where the initial latent is drawn from it."""
    seed = state_seed.to_bytes(8, "little", signed=True) if random_initial_state else b""
    return hashlib.sha256(b"rlt-kv" + seed).digest()


def key_id(key: bytes) -> int:
    """A key as the 64-bit signed block id KV events carry."""
    return int.from_bytes(key[:8], "little", signed=True)


def chain(parent: bytes, tokens, depths) -> bytes:
    """The key of a block whose positions take `tokens` and ran to `depths`, after `parent`."""
    return _chain(
        parent,
        np.asarray(tokens, dtype=np.int64).tobytes(),
        np.asarray(depths, dtype=np.int16).tobytes(),
    )


def _chain(parent: bytes, tokens: bytes, depths: bytes) -> bytes:
    return hashlib.sha256(parent + tokens + depths).digest()


def prompt_keys(
    parent: bytes, prompt: list[int], depth: int, block_size: int, first: int = 0
) -> list[bytes]:
    """Keys of a prompt's full blocks from block `first` on (every position at `depth`), the
    chain continuing from `parent` (the root for block 0). One encoding of the tokens, sliced per
    block: a long prompt's keys cost well under a millisecond per 4K tokens."""
    tokens = np.asarray(
        prompt[first * block_size : len(prompt) // block_size * block_size], dtype=np.int64
    ).tobytes()
    depths, step = np.full(block_size, depth, dtype=np.int16).tobytes(), block_size * 8
    keys = []
    for i in range(0, len(tokens), step):
        parent = _chain(parent, tokens[i : i + step], depths)
        keys.append(parent)
    return keys
