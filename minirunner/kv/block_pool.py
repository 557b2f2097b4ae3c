"""BlockPool: the physical KV blocks — free list, reference counts and the prefix-cache hash map.

Owns which block is free, how many block tables hold each one, and which full blocks are cached under a
chained hash. It never touches KV tensors and never decides which request gets blocks (the manager does).

A block with ref count 0 sits in the free queue; if it still holds a cached hash it can be revived by a
prefix hit until it is handed out again, at which point its hash is evicted (LRU: the queue's head is the
least recently freed).

Keys are sha256 chains (as in vLLM): a block's digest covers the salt (model and KV dtype), its parent
block's digest and its own token ids, stored and compared as bytes; the lookup also compares the stored
(parent digest, tokens), so even a forged or colliding digest cannot share a block with other tokens.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np

Digest = bytes  # 32-byte sha256


def chain_hash(parent_hash: Digest | None, token_ids: tuple[int, ...], salt: bytes = b"") -> Digest:
    """sha256 of a full block: salt, then the parent block's digest (32 zero bytes for the first
    block), then the token ids as little-endian int64, so equal digests mean equal prefixes under the
    same model and KV dtype."""
    h = hashlib.sha256(salt)
    h.update(parent_hash if parent_hash is not None else bytes(32))
    h.update(np.asarray(token_ids, dtype="<i8").tobytes())
    return h.digest()


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, salt: bytes = b""):
        if num_blocks < 1:
            raise ValueError("a KV block pool needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.salt = salt
        self.ref_counts = [0] * num_blocks
        # ordered set of free block ids; head = next to hand out (least recently freed)
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.block_hash: list[Digest | None] = [None] * num_blocks
        self.block_key: list[tuple[Digest | None, tuple[int, ...]] | None] = [None] * num_blocks
        # digest -> the blocks holding that prefix (two requests may compute equal blocks at once)
        self.cached: dict[Digest, dict[int, None]] = {}
        self.num_evictions = 0
        # sum over blocks of (ref count - 1) where above 1: references that share a block another table
        # already holds (prefix hits, n > 1 forks), kept as a count so nobody scans ref_counts per step
        self.num_shared_refs = 0

    # -- counts ---------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (including cached blocks nobody references)."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a reusable cached prefix."""
        return sum(1 for b in self._free if self.block_hash[b] is not None)

    # -- allocation -----------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Hand out n blocks (ref count 1 each), evicting cached hashes LRU-first."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks with {len(self._free)} free")
        blocks = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            self._evict(block)
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def share(self, block: int) -> None:
        """One more block table holds ``block`` (a prefix-cache hit); revives it if it was free."""
        if self.ref_counts[block] == 0:
            del self._free[block]
        else:
            self.num_shared_refs += 1
        self.ref_counts[block] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block. Pass a table's blocks in reverse order so that its tail
        (least likely to be shared) is evicted first."""
        for block in blocks:
            if self.ref_counts[block] <= 0:
                raise RuntimeError(f"block {block} freed more often than it was allocated")
            if self.ref_counts[block] > 1:
                self.num_shared_refs -= 1
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free[block] = None

    # -- prefix cache ---------------------------------------------------------------------------
    def lookup(self, parent_hash: Digest | None, token_ids: tuple[int, ...]) -> int | None:
        """The cached block holding exactly this (parent, tokens) full block, or None."""
        key = (parent_hash, token_ids)
        digest = chain_hash(parent_hash, token_ids, self.salt)
        blocks = [b for b in self.cached.get(digest, ()) if self.block_key[b] == key]
        # Prefer a block some table already holds: sharing it keeps the free list intact.
        return max(blocks, key=lambda b: self.ref_counts[b] > 0, default=None)

    def cache_block(self, block: int, parent_hash: Digest | None,
                    token_ids: tuple[int, ...]) -> Digest:
        """Register a full, referenced block under its chain digest; returns the digest."""
        h = chain_hash(parent_hash, token_ids, self.salt)
        if self.block_hash[block] == h:
            return h
        if self.block_hash[block] is not None:
            raise RuntimeError(f"block {block} is already cached under another prefix")
        self.cached.setdefault(h, {})[block] = None
        self.block_hash[block] = h
        self.block_key[block] = (parent_hash, token_ids)
        return h

    def uncache(self, block: int) -> None:
        """Forget the block's prefix key (its K/V may be incomplete); the block stays where it is."""
        self._evict(block, count=False)

    def _evict(self, block: int, count: bool = True) -> None:
        h = self.block_hash[block]
        if h is None:
            return
        holders = self.cached[h]
        del holders[block]
        if not holders:
            del self.cached[h]
        self.block_hash[block] = None
        self.block_key[block] = None
        self.num_evictions += count

    def reset_prefix_cache(self) -> None:
        for block in list(self._free):
            self._evict(block)

    # -- audit ----------------------------------------------------------------------------------
    def check_invariants(self, block_tables: Iterable[Iterable[int]] | None = None) -> None:
        """Raise AssertionError if the pool is inconsistent. With ``block_tables`` (every live table),
        also check each ref count equals the number of tables holding the block."""
        free = set(self._free)
        assert len(free) == len(self._free)
        in_use = {b for b in range(self.num_blocks) if self.ref_counts[b] > 0}
        assert all(rc >= 0 for rc in self.ref_counts), "negative ref count"
        assert not (free & in_use), f"blocks both free and referenced: {sorted(free & in_use)}"
        assert len(free) + len(in_use) == self.num_blocks, "a block is neither free nor in use"
        assert self.num_shared_refs == sum(rc - 1 for rc in self.ref_counts if rc > 1), \
            "the shared-reference count drifted from the ref counts"
        for h, blocks in self.cached.items():
            for block in blocks:
                assert self.block_hash[block] == h, f"block {block} is listed under hash {h} " \
                    f"but holds {self.block_hash[block]}"
        listed = sum(len(b) for b in self.cached.values())
        assert listed == sum(h is not None for h in self.block_hash), "a hashed block is unlisted"
        if block_tables is not None:
            holders = [0] * self.num_blocks
            for table in block_tables:
                for b in table:
                    holders[b] += 1
            assert holders == self.ref_counts, "ref counts differ from the number of tables " \
                "holding each block"
