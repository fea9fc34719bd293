"""Depth-aware prefix cache: full KV blocks of final positions, kept after their request lets them
go, found again by what their KV depends on.

A position's KV on every plane is a function of the tokens up to it and the depth each of those
positions ran at (prompt positions: their request's max_loops; generated positions: the depth their
token exited at), and, for a family that draws its initial latent at random (Huginn's like-init),
of the request's state seed. Within one worker the weights and the KV layout are fixed. So a block
is keyed by a hash chain over (tokens, depths) block by block, rooted in the state seed where it
matters (rlt/contract/prefix_keys.py): equal keys, equal KV on every plane, bit for bit where the
passes are batch invariant.

A cached block is one logical block of every plane together (`blocks`: its physical block per
plane). A request sharing it holds a reference; at zero references it stays cached but counts as
free, and is evicted least recently released first (a request releases its blocks last to first,
so a prefix's tail goes before its head). A block is never written while cached: a request's hits
end before its first computed position, and only final positions are cached.

Watched (watch()), it also logs what it inserts and evicts, for the worker to report to the
coordinator (an external KV-aware router's events: rlt/control/cache_events.py).
"""

from collections import OrderedDict
from dataclasses import dataclass

from rlt.contract.prefix_keys import chain, key_id, prompt_keys, root_key

__all__ = ["CachedBlock", "PrefixCache", "chain", "key_id", "prompt_keys", "root_key"]


@dataclass(slots=True)
class CachedBlock:
    key: bytes
    blocks: tuple[int, ...]  # its physical block on each plane
    refs: int = 0


class PrefixCache:
    def __init__(self):
        self._by_key: dict[bytes, CachedBlock] = {}
        self._by_block: dict[int, CachedBlock] = {}  # by its first plane's physical block
        # no references: evictable, LRU first
        self._unused: OrderedDict[bytes, CachedBlock] = OrderedDict()
        self.queried_tokens = self.hit_tokens = 0  # prompts looked up, and their positions found
        self.version = 0  # changes whenever a key comes or goes (a match found before may differ)
        self.stored: list[tuple[int, int, int]] | None = None  # watched: (tag..., key id) inserted
        self.removed: list[int] | None = None  # watched: key ids evicted

    def watch(self) -> None:
        """Log inserts and evictions from now on (take_events)."""
        self.stored, self.removed = [], []

    def take_events(self) -> tuple[list, list] | None:
        """(inserted, evicted) since the last call, or None if nothing changed (or not watched)."""
        if not self.stored and not self.removed:
            return None
        out = self.stored, self.removed
        self.stored, self.removed = [], []
        return out

    @property
    def size(self) -> int:
        """Logical blocks cached, in use or not."""
        return len(self._by_key)

    @property
    def num_unused(self) -> int:
        return len(self._unused)

    def match(self, keys: list[bytes]) -> list[CachedBlock]:
        """The cached blocks of the longest prefix of `keys`."""
        hits = []
        for k in keys:
            c = self._by_key.get(k)
            if c is None:
                break
            hits.append(c)
        return hits

    def acquire(self, blocks: list[CachedBlock]) -> None:
        """A reference to each (a request's prefix hit)."""
        unused = self._unused
        for c in blocks:
            if c.refs == 0:
                del unused[c.key]
            c.refs += 1

    def insert(self, key: bytes, blocks: tuple[int, ...], tag: tuple[int, int] = (0, 0)) -> None:
        """Cache a request's block (it holds the reference), unless that key is cached already (then
        the request's copy stays its own). tag: (generation, block index), what a watched cache logs."""
        if key not in self._by_key:
            self._by_key[key] = self._by_block[blocks[0]] = CachedBlock(key, blocks, 1)
            self.version += 1
            if self.stored is not None:
                self.stored.append((*tag, key_id(key)))

    def release(self, first_block: int) -> bool:
        """Drop a reference to the cached block whose first plane is `first_block`; False if that
        block is not cached (the caller frees it)."""
        c = self._by_block.get(first_block)
        if c is None:
            return False
        c.refs -= 1
        if c.refs == 0:
            self._unused[c.key] = c
        return True

    def evict(self) -> tuple[int, ...]:
        """Forget the least recently released unused block: its physical blocks are free."""
        _, c = self._unused.popitem(last=False)
        del self._by_key[c.key], self._by_block[c.blocks[0]]
        self.version += 1
        if self.removed is not None:
            self.removed.append(key_id(c.key))
        return c.blocks

    def clear(self) -> list[int]:
        """Forget every unused block (those in use stay cached) and the lookups counted so far (a
        worker's warm-up leaves neither): -> the physical blocks."""
        self.queried_tokens = self.hit_tokens = 0
        freed = []
        while self._unused:
            freed += self.evict()
        return freed
