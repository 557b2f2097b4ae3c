"""KVCacheManager: gives requests KV blocks — allocation on demand, prefix-cache hits, caching full
blocks as they fill, forking a request's blocks (n > 1) with copy-on-write, and freeing.

Owns the request -> BlockTable map and the list of block copies the runner must make before the next
step; never touches KV tensors itself.
"""

from __future__ import annotations

from minirunner.engine.request import Request
from minirunner.kv.block_pool import BlockPool
from minirunner.kv.block_table import BlockTable, cdiv


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 cache_salt: bytes = b""):
        self.pool = BlockPool(num_blocks, block_size, cache_salt)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.tables: dict[str, BlockTable] = {}
        self._hashes: dict[str, list[bytes]] = {}  # chain digests of a request's cached full blocks
        # (src, dst) block copies owed before the next step runs (copy-on-write of shared blocks)
        self.pending_copies: list[tuple[int, int]] = []
        # (request id, block index, block) registered in the prefix cache since the last step began
        self.step_cached: list[tuple[str, int, int]] = []

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def reservation_blocks(self, max_len: int) -> int:
        """The most blocks a request reaching max_len tokens can hold (the last sampled token's K/V is
        never written): what it needs if it were alone in the pool."""
        return self.blocks_for_tokens(max_len - 1)

    def table(self, request_id: str) -> BlockTable:
        return self.tables[request_id]

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Cached blocks holding the longest full-block prefix of the request's tokens. At least one
        token is always left to compute, since the step that computes it produces the logits."""
        # A forked child already holds its blocks; prompt logprobs need every prompt position run.
        if not self.enable_prefix_caching or request.request_id in self.tables \
                or request.params.prompt_logprobs is not None:
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
                     cached_blocks: list[int] = (), headroom: int = 0) -> bool:
        table = self.tables.get(request.request_id) or BlockTable(self.block_size)
        start = request.num_computed_tokens + len(cached_blocks) * self.block_size
        total = start + num_new_tokens
        fresh = max(0, self.blocks_for_tokens(total) - len(table) - len(cached_blocks))
        revived = sum(1 for b in cached_blocks if self.pool.ref_counts[b] == 0)
        copies = len(self._shared_in_range(table, start, total))
        return fresh + revived + copies + headroom <= self.pool.num_free_blocks

    def _written(self, table: BlockTable, start: int, end: int) -> range:
        """Indices of the table blocks that tokens [start, end) write into."""
        if end <= start:
            return range(0)
        return range(start // self.block_size, min((end - 1) // self.block_size, len(table) - 1) + 1)

    def _shared_in_range(self, table: BlockTable, start: int, end: int) -> list[int]:
        """Indices of table blocks that tokens [start, end) write into and another table holds."""
        return [i for i in self._written(table, start, end) if self.pool.ref_counts[table.blocks[i]] > 1]

    def allocate(self, request: Request, num_new_tokens: int,
                 cached_blocks: list[int] = (), headroom: int = 0) -> bool:
        """Make room for ``num_new_tokens`` more tokens (after taking ``cached_blocks`` as the prefix),
        leaving at least ``headroom`` blocks free. Returns False, changing nothing, if the pool cannot."""
        table = self.tables.get(request.request_id)
        if table is not None and not cached_blocks:  # the common decode step: room already there?
            total = request.num_computed_tokens + num_new_tokens
            if self.blocks_for_tokens(total) <= len(table) and headroom <= self.pool.num_free_blocks \
                    and not any(self.pool.ref_counts[table.blocks[i]] > 1
                                or self.pool.block_hash[table.blocks[i]] is not None
                                for i in self._written(table, request.num_computed_tokens, total)):
                return True
        if not self.can_allocate(request, num_new_tokens, cached_blocks, headroom):
            return False
        table = self.tables.setdefault(request.request_id, BlockTable(self.block_size))
        hashes = self._hashes.setdefault(request.request_id, [])
        for block in cached_blocks:
            self.pool.share(block)
            table.blocks.append(block)
            hashes.append(self.pool.block_hash[block])
        # the scheduler moves the request's count past the cached tokens (it alone writes it)
        start = request.num_computed_tokens + len(cached_blocks) * self.block_size
        total = start + num_new_tokens
        # Copy-on-write: a block another table still holds is copied before this request writes it.
        for i in self._shared_in_range(table, start, total):
            (dst,) = self.pool.allocate(1)
            src = table.blocks[i]
            self.pool.free([src])
            table.replace(i, dst)
            del hashes[i:]  # a written block is no longer the cached one (only partial blocks are)
            self.pending_copies.append((src, dst))
        # A request never rewrites its own cached blocks, but a forked completion can reach one it
        # alone holds now: the prompt's last block, which its parent filled, cached and let go of after
        # the fork. Its cache key no longer describes what it will hold: forget it.
        for i in self._written(table, start, total):
            if self.pool.block_hash[table.blocks[i]] is not None:
                self.pool.uncache(table.blocks[i])
                del hashes[i:]
        table.blocks.extend(self.pool.allocate(table.blocks_needed(total)))
        return True

    def fork(self, parent: Request, child: Request) -> None:
        """Give ``child`` a table holding the blocks of ``parent``'s prompt (one more reference each):
        the child shares the prompt's K/V and copies a shared block on its first write into it. Blocks
        past the prompt (the parent's drafts and output) are not shared: the child never reads them."""
        if child.request_id in self.tables:
            raise RuntimeError(f"request {child.request_id} already holds blocks")
        prompt_blocks = self.blocks_for_tokens(len(parent.prompt_token_ids))
        blocks = list(self.tables[parent.request_id].blocks[:prompt_blocks])
        for block in blocks:
            self.pool.share(block)
        table = BlockTable(self.block_size)
        table.blocks = blocks
        self.tables[child.request_id] = table
        self._hashes[child.request_id] = list(self._hashes.get(parent.request_id, [])[:prompt_blocks])

    def take_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) block copies owed before the next step; clears the list."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def cache_full_blocks(self, request: Request, num_tokens: int | None = None) -> None:
        """Register the blocks filled by the request's first ``num_tokens`` tokens (default: its
        computed tokens) in the prefix cache. The scheduler calls it as soon as a step is scheduled:
        every layer writes the whole batch's K/V before attending, so a request admitted in the same
        step may already share these blocks."""
        if not self.enable_prefix_caching:
            return
        table = self.tables[request.request_id]
        hashes = self._hashes[request.request_id]
        tokens = request.token_buffer
        if num_tokens is None:
            num_tokens = request.num_computed_tokens
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        for i in range(len(hashes), num_full):
            parent = hashes[-1] if hashes else None
            chunk = tuple(tokens[i * self.block_size:(i + 1) * self.block_size].tolist())
            block = table.blocks[i]
            newly = self.pool.block_hash[block] is None
            hashes.append(self.pool.cache_block(block, parent, chunk))
            if newly:
                self.step_cached.append((request.request_id, i, block))

    def begin_step(self) -> None:
        """A new step is being scheduled: blocks cached from here on are written by it."""
        self.step_cached.clear()

    def drop_step_cache(self) -> None:
        """The step failed mid-forward: forget the prefix keys of the blocks it registered (their K/V
        may be half-written); every other cached block stays."""
        for rid, index, block in self.step_cached:
            self.pool.uncache(block)
            hashes = self._hashes.get(rid)
            if hashes is not None:
                del hashes[index:]
        self.step_cached.clear()
        self.pending_copies.clear()

    def trim(self, request: Request) -> None:
        """Return the blocks past the request's computed tokens to the pool (after speculative tokens
        were rejected and ``num_computed_tokens`` rolled back). They hold no verified block, so none of
        them is in the prefix cache."""
        table = self.tables.get(request.request_id)
        if table is None:
            return
        keep = self.blocks_for_tokens(request.num_computed_tokens)
        if len(table.blocks) > keep:
            self.pool.free(reversed(table.truncate(keep)))

    def free(self, request: Request) -> None:
        table = self.tables.pop(request.request_id, None)
        self._hashes.pop(request.request_id, None)
        if table is not None:
            self.pool.free(reversed(table.blocks))

    def check_invariants(self) -> None:
        self.pool.check_invariants([t.blocks for t in self.tables.values()])
