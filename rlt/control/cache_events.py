"""The workers' prefix caches as a KV-aware router outside rlt sees them (NVIDIA Dynamo's): blocks
stored and removed, each with its tokens, so the router can hash a request's tokens and find the
worker holding its longest prefix.

rlt keys a block by its tokens AND the depth every position up to it ran at (and Huginn's state
seed: rlt/contract/prefix_keys.py); a router hashes tokens alone. So only the blocks a request with
the default loop options (every position at the model's full depth, state seed 0) would hit are
reported: a block whose key is the full-depth chain of its tokens. Those are a hit in the router
exactly when they are a hit in rlt for such a request; a block some position of which ran shallower
(an early exit, a request's max_loops) is never reported. A worker reports its inserts as
(generation, block index, key id) and its evictions as key ids (pr.CacheEvents, only when asked):
the tokens are the coordinator's already.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rlt.contract import protocol as pr
from rlt.contract.prefix_keys import key_id, prompt_keys, root_key


@dataclass(frozen=True, slots=True)
class StoredBlock:
    id: int  # 64-bit signed: its key's first 8 bytes
    parent: int | None  # the block before it (None: the first of a sequence)
    tokens: list[int]  # block_size token ids


class CacheListener(Protocol):
    """Receives each worker's reported blocks; `worker` names the slot ("unified0", "decode0")."""

    def stored(self, worker: str, blocks: list[StoredBlock]) -> None: ...

    def removed(self, worker: str, ids: list[int]) -> None: ...


class CacheRelay:
    def __init__(self, mc, block_size: int, listener: CacheListener):
        self.listener, self.block_size, self.depth = listener, block_size, mc.depth
        self.root = root_key(mc.family_config.random_initial_state, 0)
        self._chains: dict[int, list[bytes]] = {}  # generation -> its full-depth chain so far
        self._reported: dict[str, set[int]] = {}  # worker -> ids reported stored, not removed

    def on_events(
        self, worker: str, ev: pr.CacheEvents, sequence: Callable[[int], list[int] | None]
    ) -> None:
        """A worker's CacheEvents; sequence(gen): the request's tokens so far (prompt, then output),
        or None once it is gone."""
        reported = self._reported.setdefault(worker, set())
        bs, stored, seqs = self.block_size, [], {}
        for gen, index, kid in ev.stored:
            seq = seqs[gen] if gen in seqs else seqs.setdefault(gen, sequence(gen))
            if seq is None or len(seq) < (index + 1) * bs:
                continue
            chain = self._chains.setdefault(gen, [])
            if len(chain) <= index:
                parent = chain[-1] if chain else self.root
                chain += prompt_keys(parent, seq[: (index + 1) * bs], self.depth, bs, len(chain))
            if key_id(chain[index]) == kid and kid not in reported:
                reported.add(kid)
                parent = key_id(chain[index - 1]) if index else None
                stored.append(StoredBlock(kid, parent, seq[index * bs : (index + 1) * bs]))
        if stored:
            self.listener.stored(worker, stored)
        removed = [k for k in ev.removed if k in reported]
        if removed:
            reported.difference_update(removed)
            self.listener.removed(worker, removed)
        if len(self._chains) > 1024:  # (chains of requests that have ended)
            self._chains = {g: c for g, c in self._chains.items() if sequence(g) is not None}

    def forget(self, worker: str) -> None:
        """The worker is gone (its cache with it): everything it reported is removed."""
        ids = self._reported.pop(worker, set())
        if ids:
            self.listener.removed(worker, sorted(ids))
