"""Contiguous KV reservation: the pre-paging baseline, in the same KV tensor and the same runner.

Owns a first-fit allocator of contiguous runs of blocks. Each request reserves, when it is admitted, one
run long enough for the most tokens it may ever hold — ``max_model_len`` (``kv_layout="contiguous"``, the
paper's "Max" policy, as Orca-style systems do) or prompt + max_tokens (``"contiguous_exact"``, the
"Oracle" policy) — and keeps all of it until it finishes. What paging buys is then measured on the same
code: the runner reads these tables like any others (consecutive block ids). It never touches KV tensors
and has no prefix cache (a reservation is private).
"""

from __future__ import annotations

import bisect

from minirunner.engine.request import Request
from minirunner.kv.block_table import BlockTable, cdiv


class ContiguousPool:
    """Free runs of block ids kept sorted by start; first fit; neighbours merge on free."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1:
            raise ValueError("a KV block pool needs at least one block")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.starts: list[int] = [0]
        self.lengths: list[int] = [num_blocks]
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return sum(self.lengths)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        return 0

    @property
    def num_shared_refs(self) -> int:
        return 0  # a reservation is never shared

    @property
    def largest_free_run(self) -> int:
        return max(self.lengths, default=0)

    def reserve(self, n: int) -> int | None:
        """Start of the first free run of n blocks (now reserved), or None if no hole is big enough."""
        for i, length in enumerate(self.lengths):
            if length >= n:
                start = self.starts[i]
                if length == n:
                    del self.starts[i], self.lengths[i]
                else:
                    self.starts[i], self.lengths[i] = start + n, length - n
                return start
        return None

    def release(self, start: int, n: int) -> None:
        i = bisect.bisect_left(self.starts, start)
        self.starts.insert(i, start)
        self.lengths.insert(i, n)
        if i + 1 < len(self.starts) and start + n == self.starts[i + 1]:  # merge with the next run
            self.lengths[i] += self.lengths.pop(i + 1)
            self.starts.pop(i + 1)
        if i > 0 and self.starts[i - 1] + self.lengths[i - 1] == start:  # and with the previous one
            self.lengths[i - 1] += self.lengths.pop(i)
            self.starts.pop(i)

    def reset_prefix_cache(self) -> None:
        """Nothing is cached in a contiguous layout."""

    def check_invariants(self, tables: list[list[int]]) -> None:
        owned = sorted(b for t in tables for b in t)
        free = sorted(b for s, n in zip(self.starts, self.lengths, strict=True) for b in range(s, s + n))
        assert len(set(owned)) == len(owned), "a block is reserved twice"
        assert not set(owned) & set(free), "a block is both free and reserved"
        assert len(owned) + len(free) == self.num_blocks, "blocks went missing"
        assert all(t == list(range(t[0], t[0] + len(t))) for t in tables if t), "a run is not contiguous"


class ContiguousKVManager:
    """The KVCacheManager interface over contiguous reservations (``kv_layout="contiguous"`` or
    ``"contiguous_exact"``)."""

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int, exact: bool):
        self.pool = ContiguousPool(num_blocks, block_size)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.exact = exact
        self.enable_prefix_caching = False
        self.tables: dict[str, BlockTable] = {}

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def reservation_blocks(self, max_len: int) -> int:
        """Blocks reserved for a request that may reach max_len tokens (prompt + max_tokens, capped)."""
        return self.blocks_for_tokens(max_len if self.exact else self.max_model_len)

    def table(self, request_id: str) -> BlockTable:
        return self.tables[request_id]

    def find_cached_prefix(self, request: Request) -> list[int]:
        return []

    def allocate(self, request: Request, num_new_tokens: int, cached_blocks: list[int] = (),
                 headroom: int = 0) -> bool:
        """Reserve the request's whole run on its first call; later calls need nothing new. Returns False,
        changing nothing, when no free run is long enough. (A reservation never grows, so running
        requests need no headroom: it is ignored.)"""
        if request.request_id in self.tables:
            return True
        n = self.reservation_blocks(request.max_len)
        start = self.pool.reserve(n)
        if start is None:
            return False
        table = BlockTable(self.block_size)
        table.blocks = list(range(start, start + n))
        self.tables[request.request_id] = table
        return True

    def cache_full_blocks(self, request: Request, num_tokens: int | None = None) -> None:
        """No prefix cache in a contiguous layout."""

    def trim(self, request: Request) -> None:
        """Nothing to return after rejected drafts: the reservation is the request's whole run."""

    # A reservation is private: no prefix cache to roll back, no shared block to copy on write.
    def begin_step(self) -> None:
        pass

    def drop_step_cache(self) -> None:
        pass

    def take_copies(self) -> list[tuple[int, int]]:
        return []

    def fork(self, parent: Request, child: Request) -> None:
        raise ValueError("n > 1 shares the prompt's blocks, which a contiguous reservation cannot: use "
                         "kv_layout='paged'")

    def free(self, request: Request) -> None:
        table = self.tables.pop(request.request_id, None)
        if table is not None and table.blocks:
            self.pool.release(table.blocks[0], len(table.blocks))

    def check_invariants(self) -> None:
        self.pool.check_invariants([t.blocks for t in self.tables.values()])
