"""KVCacheManager: gives requests KV blocks — allocation on demand, prefix-cache hits, caching full
blocks as they fill, and freeing. Owns the request -> BlockTable map; never touches KV tensors."""

from __future__ import annotations

from minirunner.kv.block_pool import BlockPool
from minirunner.kv.block_table import BlockTable
from minirunner.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool):
        self.pool = BlockPool(num_blocks, block_size)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.tables: dict[str, BlockTable] = {}
        self._hashes: dict[str, list[int]] = {}  # chain hashes of a request's cached full blocks

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, request_id: str) -> BlockTable:
        return self.tables[request_id]

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Cached blocks holding the longest full-block prefix of the request's tokens. At least one
        token is always left to compute, since the step that computes it produces the logits."""
        if not self.enable_prefix_caching:
            return []
        tokens = request.all_token_ids
        max_blocks = (len(tokens) - 1) // self.block_size
        blocks, parent = [], None
        for i in range(max_blocks):
            chunk = tuple(tokens[i * self.block_size:(i + 1) * self.block_size])
            block = self.pool.lookup(parent, chunk)
            if block is None:
                break
            blocks.append(block)
            parent = self.pool.block_hash[block]
        return blocks

    def can_allocate(self, request: Request, num_new_tokens: int,
                     cached_blocks: list[int] = ()) -> bool:
        table = self.tables.get(request.request_id) or BlockTable(self.block_size)
        total = request.num_computed_tokens + len(cached_blocks) * self.block_size + num_new_tokens
        fresh = max(0, self.blocks_for_tokens(total) - len(table) - len(cached_blocks))
        revived = sum(1 for b in cached_blocks if self.pool.ref_counts[b] == 0)
        return fresh + revived <= self.pool.num_free_blocks

    def allocate(self, request: Request, num_new_tokens: int,
                 cached_blocks: list[int] = ()) -> bool:
        """Make room for ``num_new_tokens`` more tokens (after taking ``cached_blocks`` as the prefix).
        Returns False, changing nothing, if the pool cannot supply the blocks."""
        if not self.can_allocate(request, num_new_tokens, cached_blocks):
            return False
        table = self.tables.setdefault(request.request_id, BlockTable(self.block_size))
        hashes = self._hashes.setdefault(request.request_id, [])
        for block in cached_blocks:
            self.pool.share(block)
            table.blocks.append(block)
            hashes.append(self.pool.block_hash[block])
        if cached_blocks:
            request.num_computed_tokens += len(cached_blocks) * self.block_size
            request.num_cached_tokens = len(cached_blocks) * self.block_size
        total = request.num_computed_tokens + num_new_tokens
        table.blocks.extend(self.pool.allocate(table.blocks_needed(total)))
        return True

    def cache_full_blocks(self, request: Request, num_tokens: int | None = None) -> None:
        """Register the blocks filled by the request's first ``num_tokens`` tokens (default: its
        computed tokens) in the prefix cache. The scheduler calls it as soon as a step is scheduled:
        every layer writes the whole batch's K/V before attending, so a request admitted in the same
        step may already share these blocks."""
        if not self.enable_prefix_caching:
            return
        table = self.tables[request.request_id]
        hashes = self._hashes[request.request_id]
        tokens = request.all_token_ids
        if num_tokens is None:
            num_tokens = request.num_computed_tokens
        num_full = min(num_tokens, len(tokens)) // self.block_size
        for i in range(len(hashes), num_full):
            parent = hashes[-1] if hashes else None
            chunk = tuple(tokens[i * self.block_size:(i + 1) * self.block_size])
            hashes.append(self.pool.cache_block(table.blocks[i], parent, chunk))

    def trim(self, request: Request) -> None:
        """Return the blocks past the request's computed tokens to the pool (after speculative tokens
        were rejected and ``num_computed_tokens`` rolled back). They hold no verified block, so none of
        them is in the prefix cache."""
        table = self.tables.get(request.request_id)
        if table is None:
            return
        keep = self.blocks_for_tokens(request.num_computed_tokens)
        if len(table.blocks) > keep:
            extra = table.blocks[keep:]
            del table.blocks[keep:]
            self.pool.free(reversed(extra))

    def free(self, request: Request) -> None:
        table = self.tables.pop(request.request_id, None)
        self._hashes.pop(request.request_id, None)
        if table is not None:
            self.pool.free(reversed(table.blocks))

    def check_invariants(self) -> None:
        self.pool.check_invariants([t.blocks for t in self.tables.values()])
