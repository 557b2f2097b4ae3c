"""Persistent per-request rows of the model runner (MRv2's request state): each running request's
block-table row and sampling parameters, kept across steps so a step writes only what changed.

Owns row assignment (a free list that doubles when full) and is the only writer of block-table rows:
appending new block ids to a row, and rewriting
a row when its block table was replaced (preemption) or edited (copy-on-write, rolled-back drafts); and,
for the GPU-native input path, the record of which block-table cells changed since it was last drained
(worker/state_mirror.py copies just those to the device). Never allocates KV blocks and never touches
device tensors.
"""

from __future__ import annotations

import numpy as np

from minirunner.engine.request import Request
from minirunner.kv.block_table import BlockTable

_SEED_MASK = (1 << 63) - 1


class RequestStateRows:
    """Persistent per-request rows (MRv2's request state): the block-table row and sampling parameters.

    A request keeps its row while it runs; the row's block ids are appended as its table grows, and
    rewritten only when the table was replaced (after a preemption).
    """

    def __init__(self, capacity: int, max_blocks: int):
        self.block_tables = np.zeros((capacity, max_blocks), dtype=np.int32)
        self.num_written = np.zeros(capacity, dtype=np.int64)
        self.version = np.zeros(capacity, dtype=np.int64)
        self.temperature = np.zeros(capacity, dtype=np.float32)
        self.top_k = np.zeros(capacity, dtype=np.int64)
        self.top_p = np.ones(capacity, dtype=np.float32)
        self.seed = np.zeros(capacity, dtype=np.int64)
        self.table_of: list[BlockTable | None] = [None] * capacity
        self.row_of: dict[str, int] = {}
        self.free = list(range(capacity - 1, -1, -1))
        # row -> [first, end) of the block-table columns written since the last drain_writes (None: not
        # recorded)
        self._written: dict[int, tuple[int, int]] | None = None

    def _grow(self) -> None:
        cap = len(self.table_of)
        for name in ("block_tables", "num_written", "version", "temperature", "top_k", "top_p", "seed"):
            old = getattr(self, name)
            new = np.zeros((2 * cap, *old.shape[1:]), dtype=old.dtype)
            new[:cap] = old
            setattr(self, name, new)
        self.table_of += [None] * cap
        self.free = list(range(2 * cap - 1, cap - 1, -1)) + self.free

    def sync(self, request: Request, table: BlockTable) -> int:
        """The request's row, with its block ids up to date (only new ids are written)."""
        row = self.row_of.get(request.request_id)
        if row is None:
            if not self.free:
                self._grow()
            row = self.free.pop()
            self.row_of[request.request_id] = row
            p = request.params
            self.temperature[row] = p.temperature
            self.top_k[row] = p.top_k
            self.top_p[row] = p.top_p
            self.seed[row] = request.seed & _SEED_MASK
            self.table_of[row] = None
        if self.table_of[row] is not table or self.version[row] != table.version:
            # new, re-allocated after a preemption, or entries replaced (copy-on-write) or dropped
            # (rolled-back drafts): rewrite
            self.table_of[row], self.num_written[row], self.version[row] = table, 0, table.version
        done, blocks = self.num_written[row], table.blocks
        if len(blocks) > done:
            self.block_tables[row, done:len(blocks)] = blocks[done:]
            self.num_written[row] = len(blocks)
            if self._written is not None:
                first, end = self._written.get(row, (done, len(blocks)))
                self._written[row] = (min(first, done), max(end, len(blocks)))
        return row

    # -- the record of changed cells, for the device mirror (worker/state_mirror.py) ----------------
    def record_writes(self, on: bool = True) -> None:
        """From now on, remember (``on``) or not which block-table cells ``sync`` writes (each until
        ``drain_writes``)."""
        self._written = {} if on else None

    def drain_writes(self) -> tuple[np.ndarray, np.ndarray]:
        """The block-table cells written since the last drain, once each, and forget them: (flat
        indices row * max_blocks + column, int64 [n]; their block ids, int32 [n])."""
        written, self._written = self._written, {}
        if not written:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
        rows = np.fromiter(written, dtype=np.int64, count=len(written))
        first, end = np.array(list(written.values()), dtype=np.int64).T
        counts = end - first
        # every row's columns first .. end - 1, rows one after another
        cols = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts - first, counts)
        rows = np.repeat(rows, counts)
        return rows * self.block_tables.shape[1] + cols, self.block_tables[rows, cols]

    def release(self, request_id: str) -> None:
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self.table_of[row] = None
            self.free.append(row)
