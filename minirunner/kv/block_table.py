"""BlockTable: one request's logical -> physical block mapping, and the slots its tokens live in."""

from __future__ import annotations

import numpy as np


class BlockTable:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self.blocks: list[int] = []
        # Bumped whenever an entry is replaced in place (copy-on-write), so a reader that copies the
        # table incrementally (the runner's state rows append only new ids) knows to rewrite it.
        self.version = 0

    def replace(self, index: int, block: int) -> None:
        """Point logical block ``index`` at another physical block (copy-on-write)."""
        self.blocks[index] = block
        self.version += 1

    def truncate(self, num_blocks: int) -> list[int]:
        """Drop the blocks past the first ``num_blocks`` (rolled-back speculative tokens); returns them.
        Later blocks may reuse those positions with other ids, so this also counts as a replacement."""
        dropped = self.blocks[num_blocks:]
        del self.blocks[num_blocks:]
        self.version += 1
        return dropped

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def capacity(self) -> int:
        """Tokens the table can hold without another block."""
        return len(self.blocks) * self.block_size

    def blocks_needed(self, num_tokens: int) -> int:
        """Extra blocks required to hold ``num_tokens`` tokens in total."""
        need = -(-num_tokens // self.block_size)
        return max(0, need - len(self.blocks))

    def slots(self, start: int, end: int) -> np.ndarray:
        """Slots of token positions [start, end): block_table[pos // B] * B + pos % B (int64)."""
        pos = np.arange(start, end, dtype=np.int64)
        table = np.asarray(self.blocks, dtype=np.int64)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size
