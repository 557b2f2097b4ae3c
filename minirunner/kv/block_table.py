"""BlockTable: one request's logical -> physical block mapping; the slot formula and ceiling division.

Owns the one slot formula (``slot_of``: slot of token ``pos`` = block_table[pos // B] * B + pos % B) and
the one ceiling division (``cdiv``) of the runner; everything else that needs either calls these. It
never allocates blocks (the BlockPool does).
"""

from __future__ import annotations

import numpy as np
import torch


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints: the blocks that ``a`` tokens fill at ``b`` per block."""
    return -(-a // b)


def slot_of(tables, positions, block_size: int, rows=None):
    """The KV slot of every position: block_table[pos // B] * B + pos % B (int64).

    tables: numpy or torch int [R, max_blocks]. With ``rows`` (int, one per position): position i reads
    table row rows[i]. Without: positions is [R, q] and row i's positions read table row i (a gather,
    on the device for torch)."""
    col = positions // block_size
    if isinstance(tables, torch.Tensor):
        block = (tables[rows, col] if rows is not None else tables.gather(1, col)).long()
    else:
        block = (tables[rows, col] if rows is not None
                 else np.take_along_axis(tables, col, 1)).astype(np.int64)
    return block * block_size + positions % block_size


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

    def blocks_needed(self, num_tokens: int) -> int:
        """Extra blocks required to hold ``num_tokens`` tokens in total."""
        need = cdiv(num_tokens, self.block_size)
        return max(0, need - len(self.blocks))

    def slots(self, start: int, end: int) -> np.ndarray:
        """Slots of token positions [start, end): block_table[pos // B] * B + pos % B (int64)."""
        pos = np.arange(start, end, dtype=np.int64)
        table = np.asarray(self.blocks, dtype=np.int64)[None]
        return slot_of(table, pos, self.block_size, np.zeros_like(pos))
